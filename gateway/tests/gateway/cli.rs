//! The `gateway` command's config check, on gateway files and on routing configs.

use std::process::Command;

fn check(name: &str, contents: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("gw-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, contents).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["config", "check"])
        .arg(&file)
        .output()
        .expect("run gateway config check");
    let _ = std::fs::remove_dir_all(dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn config_check_validates_gateway_files_and_routing_configs() {
    let (ok, out) = check(
        "gateway.yaml",
        "listen: 127.0.0.1:9\npipeline:\n  - kind: provider_select\n",
    );
    assert!(ok, "{out}");

    let (ok, out) = check(
        "bad.yaml",
        "pipeline:\n  - kind: nope\n  - kind: request_log\n    levle: x\nconfigs:\n  - id: c\n    config: {provider: openai, weight: -3}\n",
    );
    assert!(!ok);
    assert!(
        out.contains("pipeline[0].kind: unknown plugin kind \"nope\""),
        "{out}"
    );
    assert!(out.contains("pipeline[1].levle"), "{out}");
    assert!(
        out.contains("configs[0].config.weight: must be >= 0"),
        "{out}"
    );

    let (ok, out) = check(
        "routing.json",
        r#"{"strategy": {"mode": "fallback", "on_status_codes": [700]},
            "targets": [{"provider": "openai"}, {"provider": "openai", "weight": -1}]}"#,
    );
    assert!(!ok);
    assert!(
        out.contains("strategy.on_status_codes: must hold HTTP statuses"),
        "{out}"
    );
    assert!(out.contains("targets[1].weight: must be >= 0"), "{out}");

    let (ok, out) = check("routing.yaml", "provider: openai\napi_key: k\n");
    assert!(ok, "{out}");
    assert!(out.contains("routing config"), "{out}");
}

#[test]
fn the_example_routing_configs_are_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/routing");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["config", "check"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 3);
}
