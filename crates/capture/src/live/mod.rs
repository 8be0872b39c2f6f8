//! Frames past a sample's copied stack, read from the live process, and what proves them: a
//! reader of the thread's memory ([`live_memory`]), a hardware write watchpoint on a stack slot
//! ([`stack_watch`]), and the kernel's frame-pointer callchain as a cross-check ([`callchain`]).

pub mod callchain;
pub mod live_memory;
pub mod stack_watch;

pub use live_memory::LiveMemory;
