//! The Tencent Cloud IM sink: each room event becomes one `send_group_msg` call on the
//! room's group, signed with a UserSig made in the sink, with a `Random` derived from
//! `event_id` so Tencent drops a retry it already has, and the reply classified as
//! delivered, retryable or permanent. Event types IM does not carry are `skipped`.
//!
//! The pure parts (settings, signing, mapping, classification) are plain modules tested
//! natively; the WebAssembly glue is in `guest`.

pub mod classify;
pub mod message;
pub mod settings;
pub mod usersig;

#[cfg(target_family = "wasm")]
mod guest;
