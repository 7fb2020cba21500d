//! Compiles our `.proto` files with protox (pure Rust, no `protoc` on any machine) and generates the
//! messages and the tonic client stubs that talk to Omni. The server stubs of the in-memory Omni are
//! generated in the `testkit` crate, over these messages.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/cosi/resource.proto",
        "proto/cosi/state.proto",
        "proto/cosi/meta.proto",
        "proto/omni/specs/infra.proto",
        "proto/omni/specs/omni.proto",
        "proto/omni/specs/siderolink.proto",
        "proto/omni/management.proto",
        "proto/provider/machine.proto",
        "proto/provider/lease.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        // tonic's prost codec with 1 KiB buffers instead of 8 KiB per call (see its module).
        .codec_path("crate::omni::codec::SmallBufferCodec")
        .compile_fds(fds)?;
    Ok(())
}
