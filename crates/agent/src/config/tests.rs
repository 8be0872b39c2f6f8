//! Parsing and checking the agent's configuration.

use super::*;

#[test]
fn defaults_are_valid_and_match_the_issue() {
    let c = AgentConfig::from_toml("", Path::new("x.toml")).unwrap();
    assert_eq!(c.frequency_hz, 99);
    assert_eq!(c.export_interval, Duration::from_secs(10));
    assert!(c.exporters.otlp.is_none());
}

#[test]
fn the_stack_copy_is_checked_and_its_rings_counted() {
    let c = AgentConfig::from_toml("", Path::new("x.toml")).unwrap();
    assert_eq!(c.stack_bytes, DEFAULT_STACK_BYTES);
    let deep = AgentConfig::from_toml("stack_bytes = 65528\n", Path::new("x.toml")).unwrap();
    assert_eq!(deep.stack_bytes, 65528);
    // Bigger rings on every CPU: counted beyond the allowance.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ring = |stack| rootline_capture::recorder::ring_bytes(99, stack);
    assert_eq!(
        deep.memory_estimate() - c.memory_estimate(),
        cpus * (ring(65528) - ring(16 << 10))
    );
    assert!(deep.memory_estimate() > c.memory_estimate());
    for bad in [
        "stack_bytes = \"64KiB\"",
        "stack_bytes = 1001",
        "stack_bytes = 0",
    ] {
        let e = AgentConfig::from_toml(bad, Path::new("x.toml")).unwrap_err();
        assert!(e.to_string().contains("stack_bytes"), "{bad}: {e}");
    }
}

#[test]
fn full_file_parses() {
    let text = r#"
        frequency_hz = 49
        export_interval = "500ms"
        export_timeout = 2
        memory_limit = "144MiB"
        kernel_walk = "off"
        [targets]
        regex = ["^java$"]
        cgroups = ["/kubepods/pod1"]
        [cache]
        buckets = 16
        byte_budget = "64KiB"
        [buffers]
        bytes = "256KiB"
        [exporters.otlp]
        endpoint = "http://127.0.0.1:4318"
        headers = { "x-api-key" = "k" }
        backoff = "100ms"
        [exporters.pprof]
        directory = "/tmp/p"
        max_bytes = "10MiB"
    "#;
    let c = AgentConfig::from_toml(text, Path::new("x.toml")).unwrap();
    assert_eq!(c.export_interval, Duration::from_millis(500));
    assert_eq!(c.export_timeout, Duration::from_secs(2));
    assert_eq!(c.cache.byte_budget, 64 << 10);
    assert_eq!(c.cache.bucket_limit, 4);
    let otlp = c.exporters.otlp.unwrap();
    assert_eq!(otlp.headers["x-api-key"], "k");
    assert_eq!(
        otlp.gzip, None,
        "unset: the environment or the default decides"
    );
    assert_eq!(c.exporters.pprof.unwrap().max_bytes, 10 << 20);
    assert_eq!(c.kernel_walk, KernelWalkSetting::Off);
}

#[test]
fn the_kernel_walk_is_on_by_default_and_counted_in_the_memory_limit() {
    let on = AgentConfig::default();
    assert_eq!(on.kernel_walk, KernelWalkSetting::Auto);
    assert!(on.memory_estimate() <= on.memory_limit);
    let off = AgentConfig::from_toml("kernel_walk = \"off\"", Path::new("a.toml")).unwrap();
    // Its rows table, a binary's rows waiting to be placed (at most half the table), its ring
    // (mapped twice) and its working set.
    assert_eq!(
        on.memory_estimate() - off.memory_estimate(),
        on.modules.kernel_rows * 3 / 2 + 2 * KERNEL_WALK_RING_BYTES + KERNEL_WALK_ALLOWANCE
    );
    assert_eq!(on.kernel_rows(), (64 << 20) / 16);
    // A larger rows table needs a larger limit, or the walk off.
    let text = "[modules]\nkernel_rows = \"128MiB\"\n";
    let err = AgentConfig::from_toml(text, Path::new("a.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("raise memory_limit"), "{err}");
    let off = format!("kernel_walk = \"off\"\n{text}");
    AgentConfig::from_toml(&off, Path::new("a.toml")).unwrap();
    let bad = AgentConfig::from_toml("kernel_walk = \"sometimes\"", Path::new("a.toml"))
        .unwrap_err()
        .to_string();
    assert!(bad.contains("line 1") && bad.contains("`off`"), "{bad}");
}

#[test]
fn errors_name_the_line_and_the_fix() {
    let err = AgentConfig::from_toml(
        "frequency_hz = 99\nexport_interval = \"10 parsecs\"\n",
        Path::new("a.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("line 2"), "{err}");
    let err = AgentConfig::from_toml("bogus = 1", Path::new("a.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("bogus"), "{err}");
    let err = AgentConfig::from_toml("memory_limit = \"1MiB\"", Path::new("a.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("raise memory_limit"), "{err}");
}

#[test]
fn printed_config_reads_back_the_same() {
    let mut c = AgentConfig {
        shutdown_timeout: Duration::from_millis(7500),
        ..AgentConfig::default()
    };
    c.exporters.otlp = Some(OtlpConfig {
        certificate: Some("/etc/rootline/ca.pem".into()),
        client_certificate: Some("/etc/rootline/tls.crt".into()),
        client_key: Some("/etc/rootline/tls.key".into()),
        ..OtlpConfig::default()
    });
    c.exporters.pprof = Some(DirConfig {
        directory: "/var/lib/rootline/pprof".into(),
        max_bytes: 1 << 20,
    });
    let text = toml::to_string(&c).unwrap();
    assert!(text.contains("shutdown_timeout = \"7500ms\""), "{text}");
    assert_eq!(
        AgentConfig::from_toml(&text, Path::new("printed.toml")).unwrap(),
        c
    );
}

#[test]
fn units() {
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_duration("x"), None);
    assert_eq!(parse_bytes("8MiB"), Some(8 << 20));
    assert_eq!(parse_bytes("12"), Some(12));
    assert_eq!(parse_bytes("3 parsecs"), None);
}

#[test]
fn dotnet_allocation_ticks_are_off_by_default_and_their_sessions_checked() {
    let c = AgentConfig::from_toml("", Path::new("x.toml")).unwrap();
    assert!(!c.dotnet.allocation_ticks);
    let on = AgentConfig::from_toml(
        "[dotnet]\nallocation_ticks = true\nsession_length = \"5s\"\n",
        Path::new("x.toml"),
    )
    .unwrap();
    assert!(on.dotnet.allocation_ticks);
    assert_eq!(on.dotnet.session_length, Duration::from_secs(5));
    on.validate().unwrap();
    let short = AgentConfig::from_toml(
        "[dotnet]\nsession_length = \"500ms\"\n",
        Path::new("x.toml"),
    )
    .and_then(|c| c.validate().map(|()| c))
    .unwrap_err();
    assert!(short.to_string().contains("session_length"), "{short}");
}
