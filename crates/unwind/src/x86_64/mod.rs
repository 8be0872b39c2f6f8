//! x86-64: the instruction analysis for code without CFI.

pub mod instruction_analysis;
