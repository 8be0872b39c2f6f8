//! Which frames are a producer's grouping frames rather than code, per frame of a profile.
//!
//! The vocabulary itself lives in [`rootline_profile::pseudo`]; depth caps count code frames only,
//! so repair measures depth without these.

use rootline_profile::{FrameId, Profile, pseudo::is_pseudo_frame};

/// One flag per frame of `profile`, indexed by [`FrameId::index`].
pub(crate) fn pseudo_flags(profile: &Profile) -> Vec<bool> {
    (0..profile.frames().len())
        .map(|i| is_pseudo_frame(profile, FrameId(i as u32)))
        .collect()
}
