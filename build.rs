//! Generates criguard's admin API (`proto/criguard/admin/v1/admin.proto`)
//! with tonic-prost-build: messages, the server trait and the client; and
//! the messages of NRI's plugin API that the NRI mode uses
//! (`proto/nri/api.proto`: messages only, its calls are dispatched by name).
//! Needs `protoc` (Debian's protobuf-compiler, installed by
//! hack/install-deps.sh; or `PROTOC=/path/to/protoc`).

fn main() -> std::io::Result<()> {
    tonic_prost_build::configure()
        .compile_protos(
            &["proto/criguard/admin/v1/admin.proto", "proto/nri/api.proto"],
            &["proto"],
        )
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("{e} (protoc is needed: run hack/install-deps.sh, or set PROTOC)"),
            )
        })
}
