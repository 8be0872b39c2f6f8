//! Crate-internal helpers for readers that build a [`Profile`] transactionally: take a
//! [`Checkpoint`], apply a batch of rows through the public `intern_*` methods, and [`Profile::restore`]
//! the checkpoint when the batch turns out to be inconsistent, so a rejected batch leaves no trace.

use crate::ids::{StringId, ThreadId};
use crate::model::{Process, SampleType, Thread};
use crate::profile::{Profile, ProfileError, Samples, check_id};

/// The sizes of the append-only tables and copies of the mutable small tables at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Checkpoint {
    strings: usize,
    mappings: usize,
    functions: usize,
    frames: usize,
    stacks: usize,
    threads: Vec<Thread>,
    processes: Vec<Process>,
    samples: usize,
}

impl Profile {
    /// An empty profile with the given sample types and *no* strings (not even `""`), for readers
    /// that replay a string table which already starts with `""`.
    pub(crate) fn with_empty_tables(sample_types: Vec<SampleType>) -> Profile {
        Profile {
            samples: Samples {
                values: vec![Vec::new(); sample_types.len()],
                ..Samples::default()
            },
            sample_types,
            ..Profile::default()
        }
    }

    /// Sets or clears a thread's name by string id, checking both ids.
    pub(crate) fn set_thread_name_id(
        &mut self,
        id: ThreadId,
        name: Option<StringId>,
    ) -> Result<(), ProfileError> {
        check_id("thread", id.0, self.threads.len())?;
        if let Some(name) = name {
            check_id("string", name.0, self.strings.len())?;
        }
        self.threads[id.index()].name = name;
        Ok(())
    }

    /// Records the current state so that [`Profile::restore`] can return to it.
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            strings: self.strings.len(),
            mappings: self.mappings.len(),
            functions: self.functions.len(),
            frames: self.frames.len(),
            stacks: self.stacks.len(),
            threads: self.threads.clone(),
            processes: self.processes.clone(),
            samples: self.samples.len(),
        }
    }

    /// Drops every row added since `checkpoint` and undoes changes to threads and processes.
    /// Samples taken with [`Profile::take_samples`] in between are not brought back.
    pub(crate) fn restore(&mut self, checkpoint: Checkpoint) {
        // Every row past the checkpoint was pushed by `intern_*`, so each has its own index entry.
        for s in self
            .strings
            .drain(checkpoint.strings.min(self.strings.len())..)
        {
            self.string_index.remove(&s);
        }
        for m in self
            .mappings
            .drain(checkpoint.mappings.min(self.mappings.len())..)
        {
            self.mapping_index.remove(&m);
        }
        for f in self
            .functions
            .drain(checkpoint.functions.min(self.functions.len())..)
        {
            self.function_index.remove(&f);
        }
        for f in self
            .frames
            .drain(checkpoint.frames.min(self.frames.len())..)
        {
            self.frame_index.remove(&f);
        }
        for node in self
            .stacks
            .drain(checkpoint.stacks.min(self.stacks.len())..)
        {
            self.stack_index.remove(&node);
        }
        self.stack_depths.truncate(self.stacks.len());
        for t in self
            .threads
            .drain(checkpoint.threads.len().min(self.threads.len())..)
        {
            self.thread_index.remove(&(t.pid, t.tid));
        }
        self.threads = checkpoint.threads;
        for p in self
            .processes
            .drain(checkpoint.processes.len().min(self.processes.len())..)
        {
            self.process_index.remove(&p.pid);
        }
        self.processes = checkpoint.processes;
        let keep = checkpoint.samples.min(self.samples.len());
        self.samples.times.truncate(keep);
        self.samples.threads.truncate(keep);
        self.samples.stacks.truncate(keep);
        for column in &mut self.samples.values {
            column.truncate(keep);
        }
    }
}
