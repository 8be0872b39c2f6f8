//! `rootline view` and `record --view`: the embedded speedscope app and the profile served on
//! 127.0.0.1 (fetched over HTTP here), and the page itself opened in headless Chromium, where the
//! app must load the profile and show its functions (`tests/js-speedscope/speedscope-check.mjs`,
//! installed by `scripts/test.sh`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

#[cfg(target_os = "linux")]
mod common {
    pub mod workload;
}

#[path = "../../../tests/support/speedscope_check.rs"]
mod speedscope_check;

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A running `rootline view`-like process, killed when dropped.
struct Viewer {
    child: Child,
    /// The URL it printed.
    url: String,
    port: u16,
    /// The profile's path on the server, from the URL's `#profileURL=`.
    profile_path: String,
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `rootline ARGS…` and waits for the URL it prints on stdout.
fn start_viewer(args: &[&str]) -> Viewer {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(args)
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("rootline runs");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    stdout.read_line(&mut url).unwrap();
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "printed {url:?}");
    let rest = &url["http://127.0.0.1:".len()..];
    let port: u16 = rest[..rest.find('/').unwrap()].parse().unwrap();
    let profile_path = url
        .split_once("#profileURL=")
        .expect("the URL names the profile")
        .1
        .replace("%2F", "/");
    Viewer {
        child,
        url,
        port,
        profile_path,
        _stdout: stdout,
    }
}

/// GETs `path` from 127.0.0.1:`port`: (status, content type, body).
fn get(port: u16, path: &str) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, content_type, response[split + 4..].to_vec())
}

/// A collapsed-stacks profile with distinctive function names: 30 samples of
/// `main;checkout_total;tax_lookup` and 10 of `main;checkout_total;render_receipt`.
fn write_folded(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("shop.folded");
    std::fs::write(
        &file,
        "shop;main;checkout_total;tax_lookup 30\nshop;main;checkout_total;render_receipt 10\n",
    )
    .unwrap();
    file
}

#[test]
fn view_serves_the_app_and_the_profile_on_localhost() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_folded(dir.path());
    let viewer = start_viewer(&[
        "view",
        file.to_str().unwrap(),
        "--no-open",
        "--timeout",
        "120",
    ]);
    assert!(
        viewer
            .profile_path
            .ends_with("/shop.folded.speedscope.json"),
        "{}",
        viewer.url
    );

    let (status, content_type, page) = get(viewer.port, "/");
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    let page = String::from_utf8(page).unwrap();
    let script = page
        .split('"')
        .find(|s| s.starts_with("speedscope-") && s.ends_with(".js"))
        .expect("the page loads speedscope's script");
    let (status, content_type, js) = get(viewer.port, &format!("/{script}"));
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("text/javascript"),
        "{content_type}"
    );
    assert!(js.len() > 100_000, "the whole app, not a stub");

    let (status, content_type, body) = get(viewer.port, &viewer.profile_path);
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/json");
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let names: Vec<&str> = json["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"tax_lookup"), "{names:?}");
    let weights: u64 = json["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["weights"].as_array().unwrap())
        .map(|w| w.as_u64().unwrap())
        .sum();
    assert_eq!(weights, 40);

    // Anything else, including the profile under another token, is not there.
    let (status, _, _) = get(
        viewer.port,
        "/profile/00000000000000000000000000000000/shop.folded.speedscope.json",
    );
    assert_eq!(status, 404);
    let (status, _, _) = get(viewer.port, "/../Cargo.toml");
    assert_eq!(status, 404);
}

#[test]
fn view_exits_by_itself_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_folded(dir.path());
    let mut viewer = start_viewer(&["view", file.to_str().unwrap(), "--timeout", "0.5"]);
    let status = viewer.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn a_busy_port_is_an_error_that_says_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = write_folded(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_rootline"))
        .args(["view", file.to_str().unwrap(), "--port", &port, "--no-open"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("choose another --port"), "{stderr}");
}

/// Opens `url` in headless Chromium and asserts the app shows `profile_name` (a thread's label, in
/// the toolbar) and `functions` (in the sandwich view's table).
fn assert_page_shows(url: &str, profile_name: &str, functions: &[&str]) {
    let output = Command::new("node")
        .arg(workspace().join("tests/js-speedscope/speedscope-check.mjs"))
        .arg(url)
        .arg(profile_name)
        .args(functions)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("\"ok\":true"),
        "the viewer page failed in Chromium:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_viewer_page_shows_the_profile_in_headless_chromium() {
    if !speedscope_check::present(workspace(), "the headless Chromium check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write_folded(dir.path());
    let viewer = start_viewer(&[
        "view",
        file.to_str().unwrap(),
        "--no-open",
        "--timeout",
        "300",
    ]);
    assert_page_shows(
        &viewer.url,
        "pid 0, tid 0",
        &["tax_lookup", "render_receipt", "checkout_total"],
    );
}

#[cfg(target_os = "linux")]
#[test]
fn record_view_shows_the_recording_in_headless_chromium() {
    if !speedscope_check::present(workspace(), "the headless Chromium check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let program = common::workload::build(dir.path(), 1, 150);
    let out = dir.path().join("shop.rlp");
    let viewer = start_viewer(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--view",
        "--no-open",
        "--timeout",
        "300",
        "--",
        program.to_str().unwrap(),
    ]);
    assert!(out.exists(), "the recording was written before serving");
    let (status, _, body) = get(viewer.port, &viewer.profile_path);
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let names: Vec<&str> = json["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"compute_totals"), "{names:?}");
    assert_page_shows(
        &viewer.url,
        "shop (pid ",
        &["compute_totals", "parse_input", "write_output"],
    );
}
