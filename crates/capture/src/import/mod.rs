//! Profiles recorded by other tools' samplers, read with rootline's unwinder and symbolizer.

pub mod perf_data;
