//! Wall-clock seconds for the OpenAI `created` field, shared by the chat, completion and embedding
//! answers.

use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
