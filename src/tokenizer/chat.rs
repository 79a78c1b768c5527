
//! Chat templates.
use serde::Serialize;
/// One chat message.
#[derive(Clone, Debug, Serialize)]
pub struct Message { pub role: String, pub content: String }
/// A chat template.
pub struct ChatTemplate;
