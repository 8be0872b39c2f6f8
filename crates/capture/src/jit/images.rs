//! ReadyToRun images read once for every process that maps them (the same CoreLib serves every
//! .NET process of a host), held to the module memory budget: while cached, an image's method
//! table counts in the recorder's [`ModuleBudget`] next to the ELF modules'. An image that does not fit is
//! refused (its frames then end their stacks, see [`super::JitProcess::image_refused`]); images
//! no process holds any more are let go when the budget is under pressure.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

use rootline_dotnet::image::r2r::{R2rError, R2rImage};
use rootline_image::{ModuleBudget, TableCharge};

/// A file's device, inode, modification time and size.
type FileIdentity = (u64, u64, i64, u64);

fn identity(path: &str) -> std::io::Result<FileIdentity> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino(), meta.mtime(), meta.size()))
}

/// Why an image could not be named from.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file could not be read.
    #[error("cannot read the image: {0}")]
    Read(#[from] std::io::Error),
    /// The file is not a ReadyToRun image the reader understands.
    #[error(transparent)]
    Parse(#[from] R2rError),
    /// Its method table would take the memory of all modules past the budget.
    #[error(
        "not loaded: its methods need {needed} bytes and modules already hold {live} of the \
         {budget}-byte budget"
    )]
    OverBudget {
        /// Memory the image's method table needs.
        needed: usize,
        /// Size of the image as mapped (`SizeOfImage`).
        size: u32,
        /// Memory all modules held when it was refused.
        live: usize,
        /// The budget.
        budget: usize,
    },
}

/// One cached image and its count in the module memory.
#[derive(Debug)]
struct Cached {
    image: Arc<R2rImage>,
    charge: TableCharge,
}

/// Most refused images remembered (their need, so that they are not read again until they fit).
const MAX_REFUSED: usize = 1024;

#[derive(Debug, Default)]
struct Images {
    entries: HashMap<FileIdentity, Cached>,
    /// Images refused for the budget: the memory their methods need and their mapped size.
    refused: HashMap<FileIdentity, (usize, u32)>,
    /// Where the method tables are counted.
    modules: ModuleBudget,
    budget: Option<usize>,
}

impl Images {
    /// Forgets the images only the cache holds.
    fn release_unheld(&mut self) {
        self.entries.retain(|_, c| Arc::strong_count(&c.image) > 1);
    }

    /// Whether an image needing `needed` bytes (`size` mapped) fits the budget, once the images
    /// only the cache holds are let go if need be.
    fn room_for(&mut self, needed: usize, size: u32) -> Result<(), ImageError> {
        let Some(budget) = self.budget else {
            return Ok(());
        };
        if !self.modules.fits(needed, budget) {
            self.release_unheld();
            if !self.modules.fits(needed, budget) {
                return Err(ImageError::OverBudget {
                    needed,
                    size,
                    live: self.modules.live_bytes(),
                    budget,
                });
            }
        }
        Ok(())
    }
}

/// ReadyToRun images already read, by file identity, shared by every process (clones share one
/// cache).
#[derive(Debug, Default, Clone)]
pub struct ImageCache {
    inner: Arc<Mutex<Images>>,
}

impl ImageCache {
    /// An empty cache whose images are counted in `modules`.
    pub fn new(modules: ModuleBudget) -> ImageCache {
        ImageCache {
            inner: Arc::new(Mutex::new(Images {
                modules,
                ..Images::default()
            })),
        }
    }

    /// Where the cached images are counted.
    pub fn modules(&self) -> ModuleBudget {
        self.lock().modules.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Images> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds the images' method tables to the module budget `bytes` (shared with the ELF
    /// modules, see [`crate::process::Processes::set_module_budget`]).
    pub fn set_module_budget(&self, bytes: usize) {
        self.lock().budget = Some(bytes);
    }

    /// The image at `path`, read and parsed on first use. Under a budget, an image that does not
    /// fit once the images no process holds are let go is refused (and not read again until its
    /// need fits).
    pub fn get(&self, path: &str) -> Result<Arc<R2rImage>, ImageError> {
        let key = identity(path)?;
        let mut images = self.lock();
        if let Some(c) = images.entries.get(&key) {
            return Ok(c.image.clone());
        }
        if let Some(&(needed, size)) = images.refused.get(&key) {
            images.room_for(needed, size)?;
        }
        let image = R2rImage::parse(&std::fs::read(path)?)?;
        let needed = image.heap_bytes();
        if let Err(refused) = images.room_for(needed, image.size) {
            if images.refused.len() >= MAX_REFUSED {
                images.refused.clear();
            }
            images.refused.insert(key, (needed, image.size));
            return Err(refused);
        }
        images.refused.remove(&key);
        let image = Arc::new(image);
        let charge = images.modules.charge(needed);
        images.entries.insert(
            key,
            Cached {
                image: image.clone(),
                charge,
            },
        );
        Ok(image)
    }

    /// Whether the image at `path` is cached (it then costs a process that maps it nothing).
    pub fn holds(&self, path: &str) -> bool {
        identity(path).is_ok_and(|key| self.lock().entries.contains_key(&key))
    }

    /// Whether an image needing `needed` bytes fits the budget now (always without one).
    pub fn has_room_for(&self, needed: usize) -> bool {
        let images = self.lock();
        images
            .budget
            .is_none_or(|budget| images.modules.fits(needed, budget))
    }

    /// Under a budget, once modules hold more than three quarters of it or something was
    /// refused for it (`refused`): lets go of the images no process holds any more. Otherwise
    /// they stay cached for the next process that maps them.
    pub fn sweep(&self, refused: bool) {
        let mut images = self.lock();
        if let Some(budget) = images.budget
            && (refused || images.modules.live_bytes() > budget / 4 * 3)
        {
            images.release_unheld();
        }
    }

    /// Memory the cached images' method tables hold, in bytes.
    pub fn bytes(&self) -> usize {
        self.lock().entries.values().map(|c| c.charge.bytes()).sum()
    }
}
