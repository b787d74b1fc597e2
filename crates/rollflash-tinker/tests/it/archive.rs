//! Sampler paths and adapter archives, without a server: the `tinker://` paths the archive
//! route takes apart, and unpacking that takes a PEFT adapter's files and refuses anything
//! that would write elsewhere (a climbing path, a link) or is not an adapter.

use rollflash_tinker::{unpack_adapter, ArchiveError, SamplerPath};

/// A gzipped tar of `(path, body)` regular files, plus a symlink where `link` says.
fn archive(files: &[(&str, &[u8])], link: Option<(&str, &str)>) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // `append_data` would refuse `..`; write the name as a hostile archive would.
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, *body).unwrap();
    }
    if let Some((path, target)) = link {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, path, target).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

const ADAPTER: [(&str, &[u8]); 2] = [
    ("./adapter_config.json", b"{\"peft_type\": \"LORA\"}"),
    ("./adapter_model.safetensors", b"weights"),
];

#[test]
fn sampler_paths_split_into_model_and_name() {
    assert_eq!(
        SamplerPath::parse("tinker://model_7/sampler_weights/rollflash-v3"),
        Some(SamplerPath {
            model_id: "model_7".into(),
            name: "rollflash-v3".into()
        })
    );
    assert_eq!(
        SamplerPath::parse("tinker://model_7/rollflash-v3"),
        SamplerPath::parse("tinker://model_7/sampler_weights/rollflash-v3"),
        "SkyRL's form"
    );
    for bad in [
        "tinker://model_7/weights/state-1",
        "http://model_7/sampler_weights/x",
        "tinker://model_7/sampler_weights/",
        "tinker://model_7/sampler_weights/a/b",
        "tinker://../sampler_weights/x",
    ] {
        assert_eq!(SamplerPath::parse(bad), None, "{bad}");
    }
}

#[test]
fn an_adapter_archive_unpacks_to_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v1");
    let files = unpack_adapter(&archive(&ADAPTER, None), &out).unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(
        std::fs::read(out.join("adapter_model.safetensors")).unwrap(),
        b"weights"
    );
}

#[test]
fn hostile_or_incomplete_archives_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("inner").join("v1");
    let climbing = [ADAPTER[0], ADAPTER[1], ("../../evil", b"x".as_slice())];
    let e = unpack_adapter(&archive(&climbing, None), &out).unwrap_err();
    assert!(matches!(e, ArchiveError::Entry { .. }), "{e}");
    assert!(!dir.path().join("evil").exists());
    let nested = [
        ADAPTER[0],
        ("sub/adapter_model.safetensors", b"x".as_slice()),
    ];
    let e = unpack_adapter(&archive(&nested, None), &out).unwrap_err();
    assert!(matches!(e, ArchiveError::Entry { .. }), "{e}");
    let e = unpack_adapter(
        &archive(&ADAPTER, Some(("link", "/etc/passwd"))),
        &dir.path().join("v2"),
    )
    .unwrap_err();
    assert!(matches!(e, ArchiveError::Entry { .. }), "{e}");
    let e = unpack_adapter(&archive(&ADAPTER[..1], None), &dir.path().join("v3")).unwrap_err();
    assert!(
        matches!(
            e,
            ArchiveError::Missing {
                file: "adapter_model.safetensors"
            }
        ),
        "{e}"
    );
    let e = unpack_adapter(b"not gzip", &dir.path().join("v4")).unwrap_err();
    assert!(matches!(e, ArchiveError::Read(_)), "{e}");
}
