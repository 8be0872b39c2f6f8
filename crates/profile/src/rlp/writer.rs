//! [`RlpWriter`]: appends one chunk per call with what changed in a [`Profile`] since the last call.

use std::io::Write;

use prost::Message;

use super::schema;
use super::{
    CHUNK_HEADER_LEN, MAX_CHUNK_LEN, MAX_DECOMPRESSED_LEN, RLP_MAGIC, RLP_VERSION, RlpError,
};
use crate::metadata::Metadata;
use crate::model::{Process, SampleType, Thread};
use crate::profile::Profile;

/// A chunk is closed once its rows' estimated encoded size passes this many bytes, so a large
/// profile written in one call becomes several chunks of bounded size.
const TARGET_CHUNK_BYTES: usize = 4 << 20;

/// A single row larger than this cannot be written (the reader's bound leaves room for the rest).
const MAX_ROW_BYTES: usize = MAX_DECOMPRESSED_LEN / 2;

/// Upper bound of one varint-encoded field: tag byte plus up to 10 value bytes.
const FIELD: usize = 11;

/// Writes a [`Profile`] as a `.rlp` stream, one chunk per [`RlpWriter::write_chunk`] call.
///
/// Call `write_chunk` with the *same* profile each time (tables only grow); each call writes the rows
/// added since the previous call, the threads and processes that are new or changed, the metadata
/// when it changed, and the samples pushed since. Each chunk is flushed to `W` when written, so a
/// recorder killed between calls leaves a file that [`super::read_rlp`] opens up to its last chunk.
///
/// Bounded-memory recording: after `write_chunk`, call [`Profile::take_samples`] to drop the samples
/// just written. The writer counts samples by their absolute index ([`Profile::samples_taken`] plus
/// the position in [`Profile::samples`]), so taking written samples is always safe; taking samples
/// that were never written is reported as [`RlpError::SamplesLost`].
///
/// Samples are written once: changing a sample after it was written (e.g. with
/// [`Profile::set_sample_stack`]) does not change the file.
///
/// ```
/// use rootline_profile::{FrameKind, Profile, RlpWriter, SampleType, read_rlp};
///
/// let mut profile = Profile::new(vec![SampleType::samples()]);
/// let mut writer = RlpWriter::new(Vec::new())?;
/// let thread = profile.intern_thread(1, 1);
/// let main = profile.intern_named_frame("main", FrameKind::Native);
/// let stack = profile.intern_stack(None, main);
/// for round in 0..3u64 {
///     profile.push_sample(round * 1_000_000, thread, stack, &[1])?;
///     writer.write_chunk(&profile)?;
///     profile.take_samples(); // keep memory bounded
/// }
/// let bytes = writer.finish()?;
/// let read = read_rlp(&bytes[..])?;
/// assert_eq!((read.chunks, read.profile.samples().len()), (3, 3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RlpWriter<W: Write> {
    out: W,
    offset: u64,
    chunks: u64,
    compressor: zstd::bulk::Compressor<'static>,
    encoded: Vec<u8>,
    marks: Marks,
    sample_types: Option<Vec<SampleType>>,
    metadata: Option<Metadata>,
    threads: Vec<Thread>,
    processes: Vec<Process>,
    /// Absolute index of the next sample to write.
    samples_written: u64,
    failed: bool,
}

/// Rows of each append-only table already written.
#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    strings: usize,
    mappings: usize,
    functions: usize,
    frames: usize,
    stacks: usize,
}

impl<W: Write> RlpWriter<W> {
    /// Writes the file header to `out` and returns a writer with zstd's default level (3).
    pub fn new(out: W) -> Result<Self, RlpError> {
        Self::with_level(out, zstd::DEFAULT_COMPRESSION_LEVEL)
    }

    /// Like [`RlpWriter::new`] with an explicit zstd compression level (1..=22; higher is smaller and
    /// slower).
    pub fn with_level(mut out: W, level: i32) -> Result<Self, RlpError> {
        let io = |source| RlpError::Io { offset: 0, source };
        let compressor = zstd::bulk::Compressor::new(level).map_err(io)?;
        out.write_all(&RLP_MAGIC).map_err(io)?;
        out.write_all(&RLP_VERSION.to_le_bytes()).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(RlpWriter {
            out,
            offset: super::RLP_HEADER_LEN as u64,
            chunks: 0,
            compressor,
            encoded: Vec::new(),
            marks: Marks::default(),
            sample_types: None,
            metadata: None,
            threads: Vec::new(),
            processes: Vec::new(),
            samples_written: 0,
            failed: false,
        })
    }

    /// Chunks written so far.
    pub fn chunks_written(&self) -> u64 {
        self.chunks
    }

    /// Bytes written so far, header included.
    pub fn bytes_written(&self) -> u64 {
        self.offset
    }

    /// Samples written so far (absolute count, see [`Profile::samples_taken`]).
    pub fn samples_written(&self) -> u64 {
        self.samples_written
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Writes everything new in `profile` since the previous call as one chunk (several if it is
    /// large), then flushes. The first call always writes a chunk (it carries the sample types);
    /// later calls with nothing new write nothing.
    ///
    /// After an error other than [`RlpError::SamplesLost`] the stream may end in a partial chunk and
    /// every later call fails; the chunks before it stay readable.
    pub fn write_chunk(&mut self, profile: &Profile) -> Result<(), RlpError> {
        if self.failed {
            return Err(RlpError::Io {
                offset: self.offset,
                source: std::io::Error::other("an earlier write to this .rlp stream failed"),
            });
        }
        self.check_same_profile(profile)?;
        let result = self.write_delta(profile);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Flushes and returns the underlying writer. Call [`RlpWriter::write_chunk`] first with the
    /// final profile so the last samples and metadata are in the file.
    pub fn finish(mut self) -> Result<W, RlpError> {
        self.out.flush().map_err(|source| RlpError::Io {
            offset: self.offset,
            source,
        })?;
        Ok(self.out)
    }

    fn check_same_profile(&mut self, profile: &Profile) -> Result<(), RlpError> {
        let tables: [(&'static str, usize, usize); 7] = [
            ("string", profile.strings().len(), self.marks.strings),
            ("mapping", profile.mappings().len(), self.marks.mappings),
            ("function", profile.functions().len(), self.marks.functions),
            ("frame", profile.frames().len(), self.marks.frames),
            ("stack", profile.stacks().len(), self.marks.stacks),
            ("thread", profile.threads().len(), self.threads.len()),
            ("process", profile.processes().len(), self.processes.len()),
        ];
        for (table, len, written) in tables {
            if len < written {
                return Err(RlpError::ProfileMismatch {
                    table,
                    len: len as u64,
                    written: written as u64,
                });
            }
        }
        if let Some(types) = &self.sample_types
            && types.as_slice() != profile.sample_types()
        {
            return Err(RlpError::ProfileMismatch {
                table: "sample type",
                len: profile.sample_types().len() as u64,
                written: types.len() as u64,
            });
        }
        let base = profile.samples_taken();
        let end = base + profile.samples().len() as u64;
        if end < self.samples_written {
            return Err(RlpError::ProfileMismatch {
                table: "sample",
                len: end,
                written: self.samples_written,
            });
        }
        if base > self.samples_written {
            let count = base - self.samples_written;
            self.samples_written = base;
            return Err(RlpError::SamplesLost { count });
        }
        Ok(())
    }

    fn fresh_chunk(&self) -> schema::Chunk {
        schema::Chunk {
            sample_types: match (&self.sample_types, self.chunks) {
                (Some(types), 0) => types
                    .iter()
                    .map(|t| schema::SampleType {
                        name: t.name.clone(),
                        unit: t.unit.clone(),
                    })
                    .collect(),
                _ => Vec::new(),
            },
            first_string: self.marks.strings as u32,
            first_mapping: self.marks.mappings as u32,
            first_function: self.marks.functions as u32,
            first_frame: self.marks.frames as u32,
            first_stack: self.marks.stacks as u32,
            ..schema::Chunk::default()
        }
    }

    fn write_delta(&mut self, p: &Profile) -> Result<(), RlpError> {
        if self.sample_types.is_none() {
            self.sample_types = Some(p.sample_types().to_vec());
        }
        let mut b = Batch {
            chunk: self.fresh_chunk(),
            size: 0,
        };

        // Tables in dependency order: a row only refers to rows of earlier tables (or, for stack
        // nodes, earlier nodes), so a chunk boundary anywhere keeps every chunk self-consistent.
        while let Some(s) = p.strings().get(self.marks.strings) {
            self.reserve(&mut b, "string", s.len() + FIELD)?;
            b.chunk.strings.push(s.to_string());
            self.marks.strings += 1;
        }
        while let Some(m) = p.mappings().get(self.marks.mappings) {
            self.reserve(&mut b, "mapping", 6 * FIELD)?;
            b.chunk.mappings.push(schema::Mapping {
                start: m.start,
                end: m.end,
                file_offset: m.file_offset,
                path: m.path.0,
                build_id: m.build_id.map(|s| s.0),
            });
            self.marks.mappings += 1;
        }
        while let Some(f) = p.functions().get(self.marks.functions) {
            self.reserve(&mut b, "function", 5 * FIELD)?;
            b.chunk.functions.push(schema::Function {
                name: f.name.0,
                file: f.file.map(|s| s.0),
                system_name: f.system_name.map(|s| s.0),
                tier: f.tier.map(|s| s.0),
            });
            self.marks.functions += 1;
        }
        while let Some(f) = p.frames().get(self.marks.frames) {
            self.reserve(&mut b, "frame", 8 * FIELD)?;
            b.chunk.frames.push(schema::Frame {
                function: f.function.0,
                mapping: f.mapping.map(|m| m.0),
                address: f.address,
                line: f.line,
                inline_depth: u32::from(f.inline_depth),
                kind: f.kind as u32,
                from_live_memory: f.from_live_memory,
            });
            self.marks.frames += 1;
        }
        while let Some(node) = p.stacks().get(self.marks.stacks) {
            self.reserve(&mut b, "stack", 2 * FIELD)?;
            let id = self.marks.stacks as u32;
            b.chunk
                .stack_parents
                .push(node.parent.map_or(0, |parent| id - parent.0));
            b.chunk.stack_frames.push(node.frame.0);
            self.marks.stacks += 1;
        }
        for (index, thread) in p.threads().iter().enumerate() {
            if self.threads.get(index) == Some(thread) {
                continue;
            }
            self.reserve(&mut b, "thread", 5 * FIELD)?;
            b.chunk.threads.push(schema::Thread {
                id: index as u32,
                pid: thread.pid,
                tid: thread.tid,
                name: thread.name.map(|s| s.0),
            });
            match self.threads.get_mut(index) {
                Some(copy) => *copy = *thread,
                None => self.threads.push(*thread),
            }
        }
        for (index, process) in p.processes().iter().enumerate() {
            if self.processes.get(index) == Some(process) {
                continue;
            }
            self.reserve(&mut b, "process", 4 * FIELD)?;
            b.chunk.processes.push(schema::Process {
                pid: process.pid,
                name: process.name.map(|s| s.0),
                command_line: process.command_line.map(|s| s.0),
            });
            match self.processes.get_mut(index) {
                Some(copy) => *copy = process.clone(),
                None => self.processes.push(process.clone()),
            }
        }
        self.add_samples(&mut b, p)?;
        if self.metadata.as_ref() != Some(&p.metadata) {
            let m = &p.metadata;
            let text = m.producer.len()
                + m.host.as_ref().map_or(0, String::len)
                + m.command_line.as_ref().map_or(0, String::len)
                + m.extra
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 3 * FIELD)
                    .sum::<usize>();
            self.reserve(&mut b, "metadata", text + 11 * FIELD)?;
            b.chunk.metadata = Some(metadata_to_schema(m));
            self.metadata = Some(m.clone());
        }
        if b.size > 0 || self.chunks == 0 {
            self.emit(&mut b)?;
        }
        Ok(())
    }

    fn add_samples(&mut self, b: &mut Batch, p: &Profile) -> Result<(), RlpError> {
        let samples = p.samples();
        let per_sample = (3 + samples.values.len()) * FIELD;
        // check_same_profile made sure samples_taken() <= samples_written <= samples_taken() + len.
        let mut next = (self.samples_written - p.samples_taken()) as usize;
        while next < samples.len() {
            self.reserve(b, "sample", per_sample)?;
            let room = (TARGET_CHUNK_BYTES.saturating_sub(b.size) / per_sample).max(1);
            let end = samples.len().min(next + room);
            let out = b.chunk.samples.get_or_insert_with(|| schema::Samples {
                values: vec![schema::ValueColumn::default(); samples.values.len()],
                ..schema::Samples::default()
            });
            // Absolute values here; `emit` turns them into deltas.
            out.time_deltas
                .extend(samples.times[next..end].iter().map(|&t| t as i64));
            out.threads
                .extend(samples.threads[next..end].iter().map(|t| t.0));
            out.stacks
                .extend(samples.stacks[next..end].iter().map(|s| s.0));
            for (column, values) in out.values.iter_mut().zip(&samples.values) {
                column.deltas.extend_from_slice(&values[next..end]);
            }
            // `reserve` already counted one sample.
            b.size += (end - next - 1) * per_sample;
            self.samples_written += (end - next) as u64;
            next = end;
        }
        Ok(())
    }

    /// Makes room for a row of `bytes` (upper bound of its encoded size): closes the batch first
    /// when the row would push a non-empty batch past the target size.
    fn reserve(
        &mut self,
        b: &mut Batch,
        table: &'static str,
        bytes: usize,
    ) -> Result<(), RlpError> {
        if bytes > MAX_ROW_BYTES {
            return Err(RlpError::RowTooLarge { table, bytes });
        }
        if b.size > 0 && b.size + bytes > TARGET_CHUNK_BYTES {
            self.emit(b)?;
        }
        b.size += bytes;
        Ok(())
    }

    /// Encodes, compresses and writes the batch as one chunk, then starts a fresh batch.
    fn emit(&mut self, b: &mut Batch) -> Result<(), RlpError> {
        let offset = self.offset;
        let io = |source| RlpError::Io { offset, source };
        if let Some(samples) = b.chunk.samples.as_mut() {
            delta_encode(&mut samples.time_deltas);
            for column in &mut samples.values {
                delta_encode(&mut column.deltas);
            }
        }
        self.encoded.clear();
        b.chunk
            .encode(&mut self.encoded)
            .map_err(|e| io(std::io::Error::other(e)))?;
        if self.encoded.len() > MAX_DECOMPRESSED_LEN {
            return Err(RlpError::RowTooLarge {
                table: "chunk",
                bytes: self.encoded.len(),
            });
        }
        let payload = self.compressor.compress(&self.encoded).map_err(io)?;
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&len| len <= MAX_CHUNK_LEN)
            .ok_or(RlpError::RowTooLarge {
                table: "chunk",
                bytes: payload.len(),
            })?;
        let mut frame = [0u8; CHUNK_HEADER_LEN];
        frame[..4].copy_from_slice(&len.to_le_bytes());
        frame[4..].copy_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        self.out.write_all(&frame).map_err(io)?;
        self.out.write_all(&payload).map_err(io)?;
        self.out.flush().map_err(io)?;
        self.offset += (CHUNK_HEADER_LEN + payload.len()) as u64;
        self.chunks += 1;
        b.chunk = self.fresh_chunk();
        b.size = 0;
        Ok(())
    }
}

/// The chunk being filled and an upper bound of its encoded size.
struct Batch {
    chunk: schema::Chunk,
    size: usize,
}

/// Replaces each value by its difference from the previous one (wrapping; the first from 0).
fn delta_encode(values: &mut [i64]) {
    let mut previous = 0i64;
    for v in values {
        let current = *v;
        *v = current.wrapping_sub(previous);
        previous = current;
    }
}

fn metadata_to_schema(m: &Metadata) -> schema::Metadata {
    schema::Metadata {
        producer: m.producer.clone(),
        start_time_ns: m.start_time_ns,
        end_time_ns: m.end_time_ns,
        host: m.host.clone(),
        command_line: m.command_line.clone(),
        sample_rate_hz: m.sample_rate_hz,
        depth_cap: m.depth_cap,
        lost_samples: m.lost_samples,
        dropped_samples: m.dropped_samples,
        truncated_samples: m.truncated_samples,
        extra: m.extra.clone(),
    }
}

/// Writes `profile` as a complete `.rlp` file (header and one or more chunks) to `out`.
pub fn write_rlp<W: Write>(out: W, profile: &Profile) -> Result<W, RlpError> {
    let mut writer = RlpWriter::new(out)?;
    writer.write_chunk(profile)?;
    writer.finish()
}
