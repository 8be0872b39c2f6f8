//! Readers and writers of other profilers' file formats, on top of [`rootline_profile::Profile`].
