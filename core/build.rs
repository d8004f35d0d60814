//! Compiles `proto/kvroute.proto` with protox (pure Rust, no `protoc` needed) and prost.
//! Messages also derive serde so the state service can accept the same fields as JSON.
fn main() {
    println!("cargo:rerun-if-changed=proto/kvroute.proto");
    let fds = protox::compile(["proto/kvroute.proto"], ["proto"]).expect("kvroute.proto must compile");
    prost_build::Config::new()
        .message_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)] #[serde(default)]")
        // JSON is for humans: the reason reads as its label ("" when none), as it always has.
        .field_attribute(".kvroute.v1.PickResponse.degraded_reason", "#[serde(with = \"crate::wire_json::degraded_reason\")]")
        .compile_fds(fds)
        .expect("prost code generation");
}
