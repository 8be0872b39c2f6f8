//! .NET image files: precompiled (ReadyToRun) code and the ECMA-335 metadata that names it.
//!
//! The runtime maps framework assemblies such as `System.Private.CoreLib.dll` from the file and
//! runs their precompiled code without writing a perf map line for it; [`r2r`] finds each
//! method's code ranges and names the method through the image's own metadata ([`ecma`]),
//! spelled as CoreCLR's perf map spells names. Pure parsing of bytes: usable by the sampler,
//! `convert` and `repair` alike.

pub mod ecma;
pub mod r2r;
