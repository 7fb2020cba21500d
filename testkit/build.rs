//! Generates the tonic server stubs of the two services the in-memory Omni serves (the COSI State
//! service and the management schematic call). Their messages are the provider crate's (`extern_path`),
//! so the in-memory Omni and the provider's client speak the very same types; the provider crate
//! generates only the client half.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = [
        proto.join("cosi/state.proto"),
        proto.join("omni/management.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&proto])?;
    let ours = "::omni_infra_provider_proxmox::omni::proto";
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .extern_path(".cosi.resource", format!("{ours}::cosi::resource"))
        .extern_path(".management", format!("{ours}::management"))
        // The provider's codec, so both ends encode alike.
        .codec_path("::omni_infra_provider_proxmox::omni::codec::SmallBufferCodec")
        .compile_fds(fds)?;
    Ok(())
}
