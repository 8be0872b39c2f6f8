//! Dense `u32` indexes into the tables of a [`crate::Profile`].

macro_rules! define_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl $name {
            /// The id as a `usize` table index.
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}

define_id!(
    /// Index of an interned string.
    StringId
);
define_id!(
    /// Index of a mapping (a loaded binary or JIT region).
    MappingId
);
define_id!(
    /// Index of a function (a name plus optional source file).
    FunctionId
);
define_id!(
    /// Index of a frame (function + mapping + address + kind).
    FrameId
);
define_id!(
    /// Index of a stack-trie node; a sample's stack is the node of its leaf frame.
    StackId
);
define_id!(
    /// Index of a thread.
    ThreadId
);
