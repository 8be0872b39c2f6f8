//! Which frames are a producer's grouping frames rather than code, per frame of a profile.
//!
//! The vocabulary itself lives in [`rootline_profile::pseudo`]; depth caps count code frames only,
//! so repair measures depth without these.

use rootline_profile::pseudo::{is_pseudo_frame, is_repair_gap};
use rootline_profile::{FrameId, Profile};

/// Two flags per frame of `profile`, indexed by [`FrameId::index`]: pseudo, and repair gap (a
/// pseudo frame repair itself wrote, which donors lend like a code frame).
pub(crate) fn pseudo_flags(profile: &Profile) -> (Vec<bool>, Vec<bool>) {
    (0..profile.frames().len())
        .map(|i| {
            let id = FrameId(i as u32);
            (is_pseudo_frame(profile, id), is_repair_gap(profile, id))
        })
        .unzip()
}
