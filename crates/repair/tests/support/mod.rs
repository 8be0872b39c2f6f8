//! Test support shared by the integration tests.

pub mod dotnet_like;
pub mod dotnet_trace_files;
