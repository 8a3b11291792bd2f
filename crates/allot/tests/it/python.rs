//! allot for Python (`clients/python`): its pytest suite, run here so that the README's one test
//! command runs it too, against daemons of the `allot` binary this build made; with it the web
//! dashboard's tests, in headless Chromium. It needs Python 3.9 or newer with the package's test
//! dependencies, and Debian's `chromium` and `chromium-driver` (`.ci/run` installs them).

use std::process::Command;

const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python");
const INSTALL: &str = "install the Python package's test dependencies: pip install './clients/python[test]' \
                       (and for the dashboard's tests: apt-get install -y chromium chromium-driver)";

#[test]
fn the_python_client_and_plugin_kit_pass_their_tests_against_real_daemons() {
    let modules = Command::new("python3")
        .args(["-c", "import httpx, pytest, mypy, yaml, selenium"])
        .output()
        .unwrap_or_else(|err| panic!("python3 is needed (apt-get install python3), then {INSTALL}: {err}"));
    assert!(modules.status.success(), "{INSTALL}\n{}", String::from_utf8_lossy(&modules.stderr));
    let output = Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(PACKAGE)
        .env("ALLOT_BIN", crate::support::ALLOT)
        .env("PYTHONPATH", PACKAGE)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("ALLOT_SERVER")
        .env_remove("ALLOT_TOKEN")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the Python tests failed:\n{text}");
    assert!(text.contains(" passed") && !text.contains("skipped"), "{text}");
}
