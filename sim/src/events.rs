//! KV events on the wire, exactly as vLLM 0.33 publishes them: msgspec-msgpack batches
//! (`encode`) sent by a ZMQ PUB socket with a ROUTER replay socket (`publisher`).

pub mod encode;
pub mod publisher;

pub use encode::{encode_batch, EventEncoding};
pub use publisher::{spawn_publisher, PubCommand, PublisherConfig, PublisherError, PublisherHandle};
