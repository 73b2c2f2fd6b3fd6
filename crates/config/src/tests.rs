//! Config checking: every problem with its path, at once.

use std::path::Path;
use std::time::Duration;

use super::*;

fn env(name: &str) -> Option<String> {
    match name {
        "SIM_TOKEN" => Some("s3cret-value".into()),
        "CI_TOKEN" => Some("ci-token-0123456789abcdef".into()),
        _ => None,
    }
}

const GOOD: &str = r#"
pool-id = "ci"
sync-interval = "30s"

[providers.sim-a]
driver = "sim.wasm"
priority = 1
rate = 2.5
max-concurrent-calls = 8
allow-hosts = ["127.0.0.1:8600"]
config = { endpoint = "http://127.0.0.1:8600", token = "${SIM_TOKEN}", literal = "$${HOME}" }
[providers.sim-a.sandbox]
memory = "128MiB"
call-deadline = "10s"
[providers.sim-a.limits]
max-instances = 50
max-ram = "512GiB"

[labels.big]
min-ready = 2
max-ready-age = "1h"
[labels.big.providers.sim-a]
instance-type = "big"
image = "ubuntu"
vcpus = 8
ram = "32GiB"
price = 0.4

[labels.slot]
slots = 4
backing-label = "big"
"#;

/// Parses `text` and compares the problems (as `path: message` lines that
/// must each contain the expected fragment).
fn check(text: &str, expect: &[(&str, &str)]) {
    let problems = match parse(text, Path::new("/etc/berth"), &env) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems,
    };
    let got: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), expect.len(), "problems: {got:#?}");
    for (path, fragment) in expect {
        assert!(
            problems
                .iter()
                .any(|p| p.path == *path && p.message.contains(fragment)),
            "no `{path}: ...{fragment}...` in {got:#?}"
        );
    }
}

#[test]
fn a_good_file_gives_typed_values_and_defaults() {
    let c = parse(GOOD, Path::new("/etc/berth"), &env).expect("valid");
    assert_eq!(c.pool.pool_id, "ci");
    assert_eq!(c.state_dir, Path::new("/etc/berth/berth-data"));
    assert_eq!(c.pool.timings.sync_interval, Duration::from_secs(30));
    assert_eq!(c.pool.timings.leak_grace, Timings::DEFAULT_LEAK_GRACE);
    let (p, d) = (&c.pool.providers[0], &c.drivers[0]);
    assert_eq!(d.driver, Path::new("/etc/berth/plugins/sim.wasm"));
    assert_eq!(p.rate, Some(2.5));
    assert_eq!(p.burst, 3);
    assert_eq!(p.max_calls, 8);
    assert_eq!(d.sandbox.max_instances, 8);
    assert_eq!(d.sandbox.memory_bytes, 128 << 20);
    assert_eq!(p.limits.max_instances, Some(50));
    assert_eq!(p.limits.max_ram_mib, Some(512 << 10));
    let cfg: serde_json::Value = serde_json::from_str(&d.driver_config).unwrap();
    assert_eq!(cfg["token"], "s3cret-value");
    assert_eq!(cfg["literal"], "${HOME}");
    let big = &c.pool.labels[0];
    assert_eq!(big.min_ready, 2);
    assert_eq!(big.launch_retries, Label::DEFAULT_LAUNCH_RETRIES);
    match &big.kind {
        LabelKind::Machine { offers } => {
            assert_eq!(offers[0].ram_mib, 32 << 10);
            assert_eq!(offers[0].options, "{}");
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(
        c.pool.labels[1].kind,
        LabelKind::Slots {
            slots: 4,
            backing: LabelIx(0),
            grace_time: Label::DEFAULT_GRACE_TIME
        }
    );
}

#[test]
fn every_problem_is_reported_at_once_with_its_path() {
    let text = r#"
pool-id = "c i"
sync-intervall = "1s"
leak-grace = "2"

[providers.a]
priority = "high"
rate = 0
allow-hosts = ["http://x/", 3]
config = { token = "${NOPE}" }
[providers.a.limits]
max-instances = -1
max-ram = "4GB"

[labels.m]
min-ready = 1
[labels.m.providers.a]
instance-type = "t"
imgae = "x"
vcpus = 0
ram = "4GiB"
[labels.m.providers.b]
instance-type = "t"
image = "x"
vcpus = 1
ram = "1GiB"

[labels.s]
slots = 0
backing-label = "s2"
[labels.s.providers.a]

[labels.s2]
slots = 2
backing-label = "s"
"#;
    check(
        text,
        &[
            ("pool-id", "must be 1 to 64"),
            ("sync-intervall", "unknown key"),
            ("leak-grace", "no unit"),
            ("providers.a.driver", "missing"),
            (
                "providers.a.priority",
                "expected an integer, found a string",
            ),
            ("providers.a.rate", "above 0"),
            ("providers.a.allow-hosts[0]", "not a URL"),
            ("providers.a.allow-hosts[1]", "expected a string"),
            ("providers.a.config.token", "NOPE is not set"),
            ("providers.a.limits.max-instances", "out of range"),
            ("providers.a.limits.max-ram", "unknown unit"),
            ("labels.m.providers.a.image", "missing"),
            ("labels.m.providers.a.imgae", "unknown key"),
            ("labels.m.providers.a.vcpus", "1 or more"),
            ("labels.m.providers.b", "no provider `b`; providers are a"),
            ("labels.s.slots", "1 to 1024"),
            ("labels.s.providers", "remove this table"),
            ("labels.s.backing-label", "is a slot label"),
            ("labels.s2.backing-label", "is a slot label"),
        ],
    );
}

#[test]
fn small_cases() {
    check("", &[("pool-id", "missing")]);
    check("pool-id = 3", &[("pool-id", "expected a string")]);
    check(
        "pool-id = \"p\"\nlabels = 1",
        &[("labels", "expected a table")],
    );
    check(
        "pool-id = \"p\"\n[labels.x]\nmin-ready = 1",
        &[("labels.x.providers", "missing")],
    );
    check(
        "pool-id = \"p\"\n[labels.x]\nslots = 2\nbacking-label = \"nope\"",
        &[("labels.x.backing-label", "no label `nope`")],
    );
    check(
        "pool-id = \"p\"\n[labels.x]\nslots = 2\nbacking-label = \"x\"",
        &[("labels.x.backing-label", "cannot back itself")],
    );
    check("pool-id = [", &[("", "not valid TOML")]);
}

#[test]
fn secrets_appear_in_no_debug_output_or_message() {
    let c = parse(GOOD, Path::new("."), &env).expect("valid");
    assert!(!format!("{c:?}").contains("s3cret-value"));
    let bad = GOOD.replace("priority = 1", "priority = \"x\"");
    let e = parse(&bad, Path::new("."), &env).unwrap_err();
    assert!(!e.to_string().contains("s3cret-value"));
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../../config/example.toml");
    let env = |name: &str| Some(format!("{name}-value-0123456789"));
    parse(text, Path::new("."), &env).expect("config/example.toml");
}

#[test]
fn sizes() {
    assert_eq!(parse::parse_size("512MiB"), Ok(512 << 20));
    assert_eq!(parse::parse_size("1TiB"), Ok(1 << 40));
    assert!(parse::parse_size("12").is_err());
    assert!(parse::parse_size("1.5GiB").is_err());
}

#[test]
fn unknown_keys_are_named_at_every_level() {
    let text = r#"
pool-id = "p"
top = 1
[providers.a]
driver = "d.wasm"
drvier = "d.wasm"
[providers.a.sandbox]
mem = "1GiB"
[providers.a.limits]
max-instance = 1
[labels.m]
minready = 1
[labels.m.providers.a]
instance-type = "t"
image = "i"
vcpus = 1
ram = "1GiB"
cost = 1
[labels.s]
slots = 2
backing-label = "m"
grace = "1s"
"#;
    check(
        text,
        &[
            ("top", "unknown key; expected one of"),
            ("providers.a.drvier", "unknown key"),
            ("providers.a.sandbox.mem", "unknown key"),
            ("providers.a.limits.max-instance", "unknown key"),
            ("labels.m.minready", "unknown key"),
            ("labels.m.providers.a.cost", "unknown key"),
            ("labels.s.grace", "unknown key"),
        ],
    );
}

#[test]
fn interpolation_reaches_nested_strings_only_in_driver_config() {
    let text = r#"
pool-id = "p"
[providers.a]
driver = "d.wasm"
[providers.a.config]
plain = "$HOME and $$ stay"
escaped = "$${SIM_TOKEN}"
list = ["${SIM_TOKEN}", { deep = "x-${SIM_TOKEN}-y" }]
[labels.m.providers.a]
instance-type = "${SIM_TOKEN}"
image = "i"
vcpus = 1
ram = "1GiB"
options = { o = "${SIM_TOKEN}" }
"#;
    let c = parse(text, Path::new("."), &env).expect("valid");
    let cfg: serde_json::Value = serde_json::from_str(&c.drivers[0].driver_config).unwrap();
    assert_eq!(cfg["plain"], "$HOME and $$ stay");
    assert_eq!(cfg["escaped"], "${SIM_TOKEN}");
    assert_eq!(cfg["list"][0], "s3cret-value");
    assert_eq!(cfg["list"][1]["deep"], "x-s3cret-value-y");
    let LabelKind::Machine { offers } = &c.pool.labels[0].kind else {
        panic!("machine label");
    };
    assert_eq!(offers[0].instance_type, "${SIM_TOKEN}");
    assert_eq!(offers[0].options, r#"{"o":"${SIM_TOKEN}"}"#);

    check(
        "pool-id = \"p\"\n[providers.a]\ndriver = \"d\"\n[providers.a.config]\n\
         a = { b = [\"${UNSET_ONE}\"] }\nc = \"${}\"\nd = \"${OPEN\"\ne = nan",
        &[
            (
                "providers.a.config.a.b[0]",
                "environment variable UNSET_ONE is not set",
            ),
            ("providers.a.config.c", "names no environment variable"),
            ("providers.a.config.d", "without a closing"),
            ("providers.a.config.e", "nan and inf"),
        ],
    );
}

#[test]
fn a_secret_is_in_no_problem_even_next_to_one() {
    // The problem is on the very string the secret is interpolated into.
    let text = "pool-id = \"p\"\n[providers.a]\ndriver = \"d\"\n\
                config = { t = \"${SIM_TOKEN}${UNSET_ONE}\" }";
    let e = parse(text, Path::new("."), &env).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert!(!e.to_string().contains("s3cret-value"), "{e}");
    assert!(!format!("{e:?}").contains("s3cret-value"), "{e:?}");
}

#[test]
fn a_syntax_error_is_one_line_with_its_position() {
    let e = parse("pool-id = \"p\"\nx = [\n", Path::new("."), &env).unwrap_err();
    assert_eq!(e.problems.len(), 1);
    let p = &e.problems[0];
    assert_eq!(p.path, "");
    assert_eq!(p.location, Some(Location { line: 2, column: 6 }));
    assert!(p.to_string().starts_with("2:6: not valid TOML: "), "{p}");
    assert!(!p.message.contains('\n'), "{p}");
}

/// Each problem carries the line and column of its key; a missing key, the
/// table it is missing from; a bad array element, the element itself.
#[test]
fn every_problem_has_the_line_and_column_of_its_key() {
    let text = r#"pool-id = "p"
sync-interval = "soon"
[providers."a.b"]
driver = "d"
allow-hosts = ["ok:1", 7]
[labels.x.providers."a.b"]
image = "i"
  vcpus = 0
ram = "1GiB"
"#;
    let e = parse(text, Path::new("."), &env).unwrap_err();
    let at = |path: &str| {
        let p = e.problems.iter().find(|p| p.path == path);
        p.unwrap_or_else(|| panic!("no {path} in {e}")).location
    };
    let loc = |line, column| Some(Location { line, column });
    assert_eq!(at("sync-interval"), loc(2, 1), "{e}");
    assert_eq!(at("providers.\"a.b\".allow-hosts[1]"), loc(5, 24), "{e}");
    assert_eq!(at("labels.x.providers.\"a.b\".vcpus"), loc(8, 3), "{e}");
    // Missing: the key of the table it belongs in, on its header line.
    assert_eq!(
        at("labels.x.providers.\"a.b\".instance-type"),
        loc(6, 21),
        "{e}"
    );
    assert_eq!(e.problems.len(), 4, "{e}");
    assert!(e.problems.iter().all(|p| p.location.is_some()), "{e}");
}

#[test]
fn a_name_with_a_dot_is_quoted_in_paths() {
    check(
        "pool-id = \"p\"\n[providers.\"a.b\"]\ndriver = 1\n[providers.\"c d\"]\ndriver = \"x\"",
        &[
            ("providers.\"a.b\".driver", "expected a string"),
            ("providers.\"c d\"", "names are 1 to 64"),
        ],
    );
}

#[test]
fn a_driver_is_a_path_inside_the_plugins_directory() {
    let with = |driver: &str| GOOD.replace("\"sim.wasm\"", &format!("{driver:?}"));
    let c = parse(&with("sub/./sim.wasm"), Path::new("/etc/berth"), &env).expect("valid");
    assert_eq!(c.drivers[0].driver_name, Path::new("sub/./sim.wasm"));
    assert_eq!(c.drivers[0].plugins_dir, Path::new("/etc/berth/plugins"));
    assert_eq!(
        c.drivers[0].driver,
        Path::new("/etc/berth/plugins/sub/sim.wasm")
    );
    for (driver, why) in [
        ("../../etc/passwd", "holds `..`"),
        ("sub/../../x.wasm", "holds `..`"),
        ("sub/..", "holds `..`"),
        ("/etc/passwd", "is an absolute path"),
        ("/etc/berth/plugins/sim.wasm", "is an absolute path"),
        ("", "is empty"),
    ] {
        check(&with(driver), &[("providers.sim-a.driver", why)]);
        check(
            &with(driver),
            &[(
                "providers.sim-a.driver",
                "relative to plugins-dir (/etc/berth/plugins), a file inside it, without `..`",
            )],
        );
    }
}

/// Regression: `driver = "../../etc/passwd"` passed `berth config check`
/// without a word, and a symlink in the plugins directory led anywhere.
#[test]
fn check_files_refuses_a_driver_that_leads_out_of_the_plugins_directory() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::write(dir.path().join("outside.wasm"), b"abc").unwrap();
    std::fs::write(plugins.join("inside.wasm"), b"abc").unwrap();
    symlink("../outside.wasm", plugins.join("up.wasm")).unwrap();
    symlink(dir.path().join("outside.wasm"), plugins.join("abs.wasm")).unwrap();
    symlink("inside.wasm", plugins.join("same.wasm")).unwrap();
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let text = format!(
        "pool-id = \"p\"\n\
         [providers.a]\ndriver = \"up.wasm\"\ndriver-sha256 = \"{abc}\"\n\
         [providers.b]\ndriver = \"abs.wasm\"\n\
         [providers.c]\ndriver = \"same.wasm\"\ndriver-sha256 = \"{abc}\"\n"
    );
    let c = parse(&text, dir.path(), &env).expect("valid");
    let problems = check_files(&c);
    let got: Vec<(&str, &str)> = (problems.iter())
        .map(|p| (p.path.as_str(), p.message.as_str()))
        .collect();
    assert_eq!(got.len(), 2, "{got:#?}");
    for (at, (path, message)) in ["a", "b"].iter().zip(&got) {
        assert_eq!(*path, format!("providers.{at}.driver"));
        assert!(
            message.contains("leads outside") && message.contains(&plugins.display().to_string()),
            "{message}"
        );
    }
}

#[test]
fn load_resolves_against_the_file_and_check_files_finds_missing_drivers() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins").join("there.wasm"), b"").unwrap();
    let file = dir.path().join("berth.toml");
    std::fs::write(
        &file,
        "pool-id = \"p\"\n[providers.a]\ndriver = \"there.wasm\"\n\
         [providers.b]\ndriver = \"gone.wasm\"\n[providers.c]\ndriver = \".\"\n\
         [store]\nurl = \"postgres://berth@db/berth?sslmode=verify-full\"\n\
         password-file = \"pgpass\"\nca-file = \"ca.pem\"",
    )
    .unwrap();
    let c = load(&file).expect("valid");
    assert_eq!(c.state_dir, dir.path().join("berth-data"));
    assert_eq!(c.drivers[0].driver, dir.path().join("plugins/there.wasm"));
    assert_eq!(c.drivers[0].driver_name, Path::new("there.wasm"));
    let problems: Vec<String> = check_files(&c).iter().map(|p| p.to_string()).collect();
    let gone = dir.path().join("plugins/gone.wasm");
    let not_file = dir.path().join("plugins/.");
    assert_eq!(
        problems,
        [
            format!(
                "store.password-file: cannot read {}: No such file or directory (os error 2)",
                dir.path().join("pgpass").display()
            ),
            format!(
                "store.ca-file: cannot read {}: No such file or directory (os error 2)",
                dir.path().join("ca.pem").display()
            ),
            format!("providers.b.driver: no such file: {}", gone.display()),
            format!("providers.c.driver: not a file: {}", not_file.display()),
        ]
    );

    let e = load(&dir.path().join("absent.toml")).unwrap_err();
    assert_eq!(e.problems.len(), 1);
    assert!(e.problems[0].message.starts_with("reading "), "{e}");
}

#[test]
fn api_tokens_and_leases() {
    let text = r#"
pool-id = "p"
[api]
listen = "0.0.0.0:9000"
lease-ttl = "90s"
allow-plain-http = true
[api.tokens.ci]
role = "client"
token = "${CI_TOKEN}"
[api.tokens.ops]
role = "admin"
token = "admin-0123456789abcdef"
"#;
    let c = parse(text, Path::new("."), &env).expect("valid");
    assert_eq!(c.api.listen.to_string(), "0.0.0.0:9000");
    assert_eq!(c.pool.requestor_lease_ttl, Duration::from_secs(90));
    let names: Vec<(&str, Role)> = c
        .api
        .tokens
        .iter()
        .map(|t| (t.name.as_str(), t.role))
        .collect();
    assert_eq!(names, [("ci", Role::Client), ("ops", Role::Admin)]);
    assert_eq!(c.api.tokens[0].secret, "ci-token-0123456789abcdef");
    let shown = format!("{c:?}");
    assert!(!shown.contains("ci-token-0123") && !shown.contains("admin-0123"));

    let d = parse("pool-id = \"p\"", Path::new("."), &env).expect("valid");
    assert_eq!(d.api, ApiSettings::default());
    assert!(d.api.listen.ip().is_loopback());
}

#[test]
fn api_tls() {
    let text = r#"
pool-id = "p"
[api]
listen = "[::]:8443"
tls-cert = "tls/berth.crt"
tls-key = "/etc/berth/berth.key"
tls-peer-ca = "ca.pem"
advertise = "https://10.0.0.5:8443"
[api.tokens.ops]
role = "admin"
token = "admin-0123456789abcdef"
"#;
    let c = parse(text, Path::new("/etc/berth"), &env).expect("valid");
    let tls = c.api.tls.expect("TLS");
    assert_eq!(tls.cert, Path::new("/etc/berth/tls/berth.crt"));
    assert_eq!(tls.key, Path::new("/etc/berth/berth.key"));
    assert_eq!(tls.peer_ca.as_deref(), Some(Path::new("/etc/berth/ca.pem")));
    assert!(!c.api.allow_plain_http);
    // The same listen address without TLS needs it allowed.
    let plain = text
        .replace("tls-cert = \"tls/berth.crt\"\n", "")
        .replace("tls-key = \"/etc/berth/berth.key\"\n", "")
        .replace("tls-peer-ca = \"ca.pem\"\n", "")
        .replace("https://", "http://");
    let e = parse(&plain, Path::new("/etc/berth"), &env).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(e.problems[0].path, "api.listen");
    assert!(
        e.problems[0].message.contains("api.allow-plain-http"),
        "{e}"
    );
    let allowed = plain.replace("[api]\n", "[api]\nallow-plain-http = true\n");
    parse(&allowed, Path::new("/etc/berth"), &env).expect("plain HTTP allowed");
}

#[test]
fn api_problems() {
    check(
        "pool-id = \"p\"\n[api]\nlisten = \"0.0.0.0:80\"",
        &[("api.listen", "no api.tokens are configured")],
    );
    check(
        "pool-id = \"p\"\n[api]\nlisten = \"0.0.0.0:80\"\n\
         [api.tokens.a]\nrole = \"admin\"\ntoken = \"0123456789abcdefg\"",
        &[(
            "api.listen",
            "no TLS: its tokens would cross the network in the clear",
        )],
    );
    check(
        "pool-id = \"p\"\n[api]\ntls-cert = \"c.pem\"\nadvertise = \"http://10.0.0.5:80\"",
        // No TLS after all: the advertised url is plain http, as it must.
        &[("api.tls-key", "missing: api.tls-cert needs the key")],
    );
    check(
        "pool-id = \"p\"\n[api]\ntls-cert = \"c.pem\"\ntls-key = \"k.pem\"\n\
         advertise = \"http://10.0.0.5:80\"",
        &[("api.advertise", "at an https:// url")],
    );
    check(
        "pool-id = \"p\"\n[api]\ntls-key = \"k.pem\"\ntls-peer-ca = \"ca.pem\"",
        &[("api.tls-cert", "missing: api.tls-key needs the certificate")],
    );
    check(
        "pool-id = \"p\"\n[api]\ntls-peer-ca = \"ca.pem\"",
        &[("api.tls-peer-ca", "only with api.tls-cert and api.tls-key")],
    );
    check(
        "pool-id = \"p\"\n[api]\nlisten = \"localhost\"\nlease-ttl = \"0s\"\nport = 1",
        &[
            ("api.listen", "not an address and port"),
            ("api.lease-ttl", "more than zero"),
            ("api.port", "unknown key"),
        ],
    );
    check(
        "pool-id = \"p\"\n[api.tokens.a]\nrole = \"root\"\ntoken = \"0123456789abcdefg\"\n\
         [api.tokens.b]\nrole = \"client\"\ntoken = \"short\"\n\
         [api.tokens.c]\ntoken = \"0123456789abcdefg\"",
        &[
            ("api.tokens.a.role", "not a role"),
            ("api.tokens.b.token", "at least 16"),
            ("api.tokens.c.role", "missing"),
        ],
    );
    check(
        "pool-id = \"p\"\n[api.tokens.a]\nrole = \"client\"\ntoken = \"0123456789abcdefg\"\n\
         [api.tokens.b]\nrole = \"admin\"\ntoken = \"0123456789abcdefg\"",
        &[("api.tokens.b.token", "same secret")],
    );
}

const CREDENTIALED: &str = r#"
pool-id = "p"
[providers.ec2]
driver = "aws-ec2.wasm"
allow-hosts = ["*.amazonaws.com", "127.0.0.1:5000"]
[[providers.ec2.credentials]]
host = "ec2.us-east-1.amazonaws.com"
kind = "aws-sigv4"
region = "us-east-1"
service = "ec2"
access-key-id = "AKIDEXAMPLE"
secret-access-key = "${SIM_TOKEN}"
[[providers.ec2.credentials]]
host = "127.0.0.1:5000"
kind = "bearer"
token = "${CI_TOKEN}"
"#;

#[test]
fn credentials_are_read_and_never_shown() {
    let c = parse(CREDENTIALED, Path::new("."), &env).expect("valid");
    let p = &c.drivers[0];
    assert_eq!(p.credentials.len(), 2);
    match &p.credentials[0].auth {
        crate::Auth::AwsSigV4 {
            secret_access_key,
            region,
            ..
        } => {
            assert_eq!(secret_access_key.read().unwrap().expose(), "s3cret-value");
            assert_eq!(region, "us-east-1");
        }
        other => panic!("{other:?}"),
    }
    match &p.credentials[1].auth {
        crate::Auth::Header {
            name,
            scheme,
            value,
        } => {
            assert_eq!(name, "authorization");
            assert_eq!(*scheme, Some("Bearer"));
            assert_eq!(value.read().unwrap().expose(), "ci-token-0123456789abcdef");
        }
        other => panic!("{other:?}"),
    }
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("s3cret-value") && !shown.contains("ci-token"),
        "{shown}"
    );
    // The driver's own config holds none of it.
    assert_eq!(p.driver_config, "{}");
}

#[test]
fn credential_problems() {
    check(
        &CREDENTIALED
            .replace("host = \"127.0.0.1:5000\"", "host = \"127.0.0.1:6000\"")
            .replace(
                "secret-access-key = \"${SIM_TOKEN}\"",
                "secret-access-key = \"inline\"",
            )
            .replace("service = \"ec2\"", "servise = \"ec2\""),
        &[
            (
                "providers.ec2.credentials[1].host",
                "not in the provider's allow-hosts",
            ),
            (
                "providers.ec2.credentials[0].secret-access-key",
                "must come from the environment",
            ),
            ("providers.ec2.credentials[0].service", "missing"),
            ("providers.ec2.credentials[0].servise", "unknown key"),
        ],
    );
    check(
        &CREDENTIALED.replace("kind = \"bearer\"", "kind = \"basic\""),
        &[(
            "providers.ec2.credentials[1].kind",
            "not aws-sigv4, bearer, header, keystone",
        )],
    );
    check(
        &CREDENTIALED.replace("${CI_TOKEN}", "${NOPE}"),
        &[("providers.ec2.credentials[1].token", "NOPE is not set")],
    );
}

#[test]
fn a_postgres_store_takes_its_password_from_the_environment_or_a_file() {
    let text = "pool-id = \"p\"\n[store]\nurl = \"postgres://berth@db.example:5433/pool\"\n\
                password = \"${SIM_TOKEN}\"";
    let c = parse(text, Path::new("/etc/berth"), &env).expect("valid");
    let pg = c.store.postgres.as_ref().expect("postgres");
    assert_eq!(pg.url, "postgres://berth@db.example:5433/pool");
    match &pg.password {
        Some(Password::Value(p)) => assert_eq!(p.expose(), "s3cret-value"),
        other => panic!("{other:?}"),
    }
    assert!(!format!("{c:?}").contains("s3cret-value"));

    let text = "pool-id = \"p\"\n[store]\nurl = \"postgresql://berth@127.0.0.1/berth\"\n\
                password-file = \"secrets/db\"";
    let c = parse(text, Path::new("/etc/berth"), &env).expect("valid");
    match &c.store.postgres.as_ref().unwrap().password {
        Some(Password::File(f)) => assert_eq!(f, Path::new("/etc/berth/secrets/db")),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.store.postgres.as_ref().unwrap().pool_lease_ttl,
        Postgres::DEFAULT_LEASE_TTL
    );
    assert_eq!(c.store.postgres.as_ref().unwrap().ca_file, None);
    // No [store], or no url: the embedded store.
    let c = parse("pool-id = \"p\"", Path::new("."), &env).unwrap();
    assert!(c.store.postgres.is_none());
}

#[test]
fn a_postgres_store_over_tls_names_its_ca_file_beside_the_config() {
    for mode in ["require", "verify-ca", "verify-full"] {
        let text = format!(
            "pool-id = \"p\"\n[store]\nurl = \"postgres://berth@db.example/pool?sslmode={mode}\"\n\
             ca-file = \"tls/ca.pem\""
        );
        let c = parse(&text, Path::new("/etc/berth"), &env).expect("valid");
        let pg = c.store.postgres.unwrap();
        assert_eq!(
            pg.ca_file.as_deref(),
            Some(Path::new("/etc/berth/tls/ca.pem"))
        );
    }
    // Without a ca-file, the system's roots.
    let text = "pool-id = \"p\"\n[store]\nurl = \"postgres://berth@db/p?sslmode=verify-full\"";
    assert!(parse(text, Path::new("."), &env).is_ok());
}

#[test]
fn processes_sharing_a_pool_set_their_lease_and_where_they_are_reached() {
    let text = "pool-id = \"p\"\n[api]\nadvertise = \"http://10.0.0.5:8080\"\n\
                [store]\nurl = \"postgres://berth@db/berth\"\npool-lease-ttl = \"3s\"";
    let c = parse(text, Path::new("."), &env).expect("valid");
    assert_eq!(c.api.advertise.as_deref(), Some("http://10.0.0.5:8080"));
    assert_eq!(
        c.store.postgres.unwrap().pool_lease_ttl,
        std::time::Duration::from_secs(3)
    );
    let store = "[store]\nurl = \"postgres://berth@db/berth\"\n";
    check(
        &format!("pool-id = \"p\"\n{store}pool-lease-ttl = \"100ms\""),
        &[("store.pool-lease-ttl", "at least 500ms")],
    );
    check(
        "pool-id = \"p\"\n[store]\npool-lease-ttl = \"5s\"",
        &[("store.pool-lease-ttl", "only a PostgreSQL store")],
    );
    for (url, says) in [
        ("https://10.0.0.5:8080", "plain http"),
        ("http://10.0.0.5:8080/berth", "only http://HOST:PORT"),
        ("10.0.0.5:8080", "not a url"),
    ] {
        check(
            &format!("pool-id = \"p\"\n[api]\nadvertise = \"{url}\"\n{store}"),
            &[("api.advertise", says)],
        );
    }
}

#[test]
fn postgres_store_problems() {
    let at = |url: &str, rest: &str| format!("pool-id = \"p\"\n[store]\nurl = \"{url}\"\n{rest}");
    check(
        &at("postgres://berth:hunter2@db/berth", ""),
        &[("store.url", "holds a password")],
    );
    check(
        &at("postgres://berth@db/berth?password=hunter2", ""),
        &[("store.url", "holds a password")],
    );
    check(
        &at("mysql://berth@db/berth", ""),
        &[("store.url", "not a PostgreSQL url")],
    );
    check(&at("db.example", ""), &[("store.url", "not a url")]);
    check(
        &at("postgres://db/berth", ""),
        &[("store.url", "names no user")],
    );
    check(
        &at("postgres://berth@db/berth?sslmode=allow", ""),
        &[("store.url", "sslmode=allow is not a mode berth knows")],
    );
    check(
        &at(
            "postgres://berth@db/berth?sslmode=verify-full&sslrootcert=ca.pem",
            "",
        ),
        &[("store.url", "give the CA file as `ca-file`")],
    );
    check(
        &at("postgres://berth@db/berth", "ca-file = \"ca.pem\""),
        &[("store.ca-file", "applies only over TLS")],
    );
    check(
        "pool-id = \"p\"\n[store]\nca-file = \"ca.pem\"",
        &[("store.ca-file", "only a PostgreSQL store")],
    );
    check(
        &at(
            "postgres://berth@db/berth",
            "password = \"hunter2\"\nsync = \"full\"",
        ),
        &[
            ("store.password", "must come from the environment"),
            ("store.sync", "synchronous_commit"),
        ],
    );
    check(
        &at("postgres://berth@db/berth", "password = \"${NOPE}\""),
        &[("store.password", "NOPE is not set")],
    );
    check(
        &at(
            "postgres://berth@db/berth",
            "password = \"${SIM_TOKEN}\"\npassword-file = \"f\"",
        ),
        &[("store.password-file", "not both")],
    );
    check(
        "pool-id = \"p\"\n[store]\npassword-file = \"f\"",
        &[("store.password-file", "only a PostgreSQL store")],
    );
    // The password in a refused url is not repeated in the problem.
    let e = parse(
        &at("postgres://berth:hunter2@db/berth", ""),
        Path::new("."),
        &env,
    )
    .unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[test]
fn readiness_defaults_to_ssh_can_be_set_for_the_file_and_per_label_and_is_checked() {
    let c = parse(GOOD, Path::new("."), &env).expect("valid");
    assert_eq!(c.pool.labels[0].ready, Readiness::SSH, "the default");
    let text = GOOD
        .replace(
            "sync-interval = \"30s\"",
            "sync-interval = \"30s\"\nready = \"running\"",
        )
        .replace(
            "max-ready-age = \"1h\"",
            "max-ready-age = \"1h\"\nready = \"tcp\"\nready-port = 2222\nready-timeout = \"3s\"",
        );
    let c = parse(&text, Path::new("."), &env).expect("valid");
    assert_eq!(
        c.pool.labels[0].ready,
        Readiness {
            check: Check::Tcp,
            port: Some(2222),
            timeout: Duration::from_secs(3),
        }
    );
    let only_default = GOOD.replace("sync-interval = \"30s\"", "ready = \"running\"");
    let c = parse(&only_default, Path::new("."), &env).expect("valid");
    assert_eq!(c.pool.labels[0].ready, Readiness::RUNNING);
    check(
        &GOOD
            .replace("sync-interval = \"30s\"", "ready = \"ping\"")
            .replace(
                "max-ready-age = \"1h\"",
                "ready = \"running\"\nready-port = 0\nready-timeout = \"0s\"",
            )
            .replace(
                "backing-label = \"big\"",
                "backing-label = \"big\"\nready = \"ssh\"",
            ),
        &[
            ("ready", "`ping` is not running, tcp or ssh"),
            ("labels.big.ready-port", "must be 1 to 65535"),
            ("labels.big.ready-port", "nothing is probed"),
            ("labels.big.ready-timeout", "must be more than 0"),
            ("labels.big.ready-timeout", "nothing is probed"),
            ("labels.slot.ready", "set this on the backing label"),
        ],
    );
}

#[test]
fn overlapping_allow_lists_are_warned_of_naming_both_providers() {
    let overlap = |a: &str, b: &str| {
        AllowedHost::parse(a)
            .unwrap()
            .overlaps(&AllowedHost::parse(b).unwrap())
    };
    for (a, b, want) in [
        ("api.example.com", "api.example.com", true),
        ("api.example.com:443", "api.example.com", true),
        ("api.example.com:443", "api.example.com:443", true),
        ("api.example.com:443", "api.example.com:8443", false),
        ("*.example.com", "api.example.com:443", true),
        ("*.example.com", "example.com", false),
        ("*.example.com", "*.eu.example.com", true),
        ("*.example.com", "*.example.org", false),
        ("127.0.0.1", "127.0.0.1:8181", true),
        ("[::ffff:127.0.0.1]:8181", "127.0.0.1:8181", true),
        ("127.0.0.1:8181", "127.0.0.2:8181", false),
    ] {
        assert_eq!(overlap(a, b), want, "{a} and {b}");
        assert_eq!(overlap(b, a), want, "{b} and {a}");
    }
    let text = r#"
pool-id = "p"
[providers.east]
driver = "a.wasm"
allow-hosts = ["api.example.com:443", "127.0.0.1:9000"]
[providers.west]
driver = "a.wasm"
allow-hosts = ["*.example.com"]
[providers.lab]
driver = "a.wasm"
allow-hosts = ["127.0.0.1:9001"]
"#;
    let settings = parse(text, Path::new("/etc/berth"), &env).unwrap();
    let mut warned = warnings(&settings);
    locate(text, &mut warned);
    let shown: Vec<String> = warned.iter().map(|w| w.to_string()).collect();
    assert_eq!(shown.len(), 1, "{shown:#?}");
    assert!(
        shown[0].starts_with("8:")
            && shown[0].contains(
                "providers.west.allow-hosts[0]: `*.example.com` overlaps `api.example.com:443` of provider east (providers.east.allow-hosts[0])"
            ),
        "{shown:#?}"
    );
    assert!(shown[0].contains("east and west"), "{shown:#?}");
}

/// A provider with a credential of each kind exchanged for tokens, and a
/// client certificate; `{N}` is replaced per case.
const EXCHANGED: &str = r#"
pool-id = "p"
[providers.os]
driver = "openstack.wasm"
allow-hosts = ["keystone.example.com:5000", "nova.example.com", "*.googleapis.com", "management.azure.com", "k8s.example.com"]
[[providers.os.credentials]]
host = "nova.example.com"
kind = "keystone"
auth-url = "https://keystone.example.com:5000/v3/"
username = "ci"
password-file = "secrets/os-password"
project-name = "ci-project"
project-domain = "ci-domain"
ca-file = "tls/keystone-ca.crt"
[[providers.os.credentials]]
host = "keystone.example.com:5000"
kind = "keystone"
auth-url = "https://keystone.example.com:5000/v3"
application-credential-id = "a1b2"
application-credential-secret = "${SIM_TOKEN}"
[[providers.os.credentials]]
host = "*.googleapis.com"
kind = "google-service-account"
key-file = "/etc/berth/gce.json"
[[providers.os.credentials]]
host = "management.azure.com"
kind = "oauth2-client-credentials"
token-url = "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token"
client-id = "app-1"
client-secret = "${CI_TOKEN}"
scope = "https://management.azure.com/.default"
[[providers.os.credentials]]
host = "k8s.example.com"
kind = "client-certificate"
cert-file = "tls/client.crt"
key-file = "tls/client.key"
ca-file = "tls/ca.crt"
"#;

#[test]
fn credentials_exchanged_for_tokens_are_read() {
    let c = parse(EXCHANGED, Path::new("/etc/berth"), &env).expect("valid");
    let creds = &c.drivers[0].credentials;
    let kinds: Vec<&str> = creds.iter().map(|c| c.auth.kind()).collect();
    assert_eq!(
        kinds,
        [
            "keystone",
            "keystone",
            "google-service-account",
            "oauth2-client-credentials",
            "client-certificate"
        ]
    );
    match &creds[0].auth {
        Auth::Keystone(k) => {
            // The trailing slash goes: tokens are at `{auth-url}/auth/tokens`.
            assert_eq!(k.auth_url, "https://keystone.example.com:5000/v3");
            match &k.method {
                KeystoneMethod::Password {
                    user,
                    password,
                    project,
                } => {
                    assert_eq!(
                        *user,
                        KeystoneRef::Name {
                            name: "ci".into(),
                            domain: "Default".into()
                        }
                    );
                    assert_eq!(
                        *password,
                        SecretSource::File("/etc/berth/secrets/os-password".into())
                    );
                    assert_eq!(
                        *project,
                        Some(KeystoneRef::Name {
                            name: "ci-project".into(),
                            domain: "ci-domain".into()
                        })
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    match &creds[2].auth {
        Auth::Google(g) => {
            assert_eq!(g.key, SecretSource::File("/etc/berth/gce.json".into()));
            assert_eq!(g.scopes, ["https://www.googleapis.com/auth/cloud-platform"]);
        }
        other => panic!("{other:?}"),
    }
    let files: Vec<String> = creds
        .iter()
        .flat_map(|c| c.auth.files())
        .map(|(k, p)| format!("{k}={}", p.display()))
        .collect();
    assert_eq!(
        files,
        [
            "password-file=/etc/berth/secrets/os-password",
            "ca-file=/etc/berth/tls/keystone-ca.crt",
            "key-file=/etc/berth/gce.json",
            "cert-file=/etc/berth/tls/client.crt",
            "key-file=/etc/berth/tls/client.key",
            "ca-file=/etc/berth/tls/ca.crt"
        ]
    );
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("s3cret-value") && !shown.contains("ci-token"),
        "{shown}"
    );
}

#[test]
fn exchanged_credential_problems() {
    check(
        &EXCHANGED
            .replace(
                "https://keystone.example.com:5000/v3/",
                "http://keystone.example.com:5000/v3",
            )
            .replace(
                "password-file = \"secrets/os-password\"",
                "password-file = \"a\"\npassword = \"${SIM_TOKEN}\"",
            )
            .replace(
                "client-secret = \"${CI_TOKEN}\"",
                "client-secret = \"${CI_TOKEN}\"\nprivate-key-file = \"k.pem\"",
            )
            .replace("key-file = \"/etc/berth/gce.json\"", "scopes = []"),
        &[
            ("providers.os.credentials[0].auth-url", "must be https://"),
            ("providers.os.credentials[0].password-file", "not both"),
            ("providers.os.credentials[2].key", "missing"),
            ("providers.os.credentials[2].scopes", "names no scope"),
            ("providers.os.credentials[3].client-secret", "not both"),
        ],
    );
    // Plain HTTP only to a loopback address; an application credential
    // names its own user.
    check(
        &EXCHANGED
            .replace(
                "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token",
                "http://127.0.0.1:9000/token",
            )
            .replace(
                "application-credential-secret = \"${SIM_TOKEN}\"",
                "application-credential-secret = \"${SIM_TOKEN}\"\nusername = \"x\"",
            ),
        &[("providers.os.credentials[1].username", "leave this out")],
    );
}

#[test]
fn a_driver_is_pinned_by_its_digest_in_hex() {
    let pinned = |pin: &str| {
        GOOD.replace(
            "driver = \"sim.wasm\"\n",
            &format!("driver = \"sim.wasm\"\ndriver-sha256 = \"{pin}\"\n"),
        )
    };
    let digest = "4C095FFD94318C5403F4EE3A1BD096F285BB2376123131DE061D9FFBBC46C28F";
    let c = parse(&pinned(digest), Path::new("/etc/berth"), &env).expect("valid");
    assert_eq!(
        c.drivers[0].driver_sha256,
        Some(digest.to_ascii_lowercase())
    );
    assert_eq!(
        parse(GOOD, Path::new("/etc/berth"), &env)
            .expect("valid")
            .drivers[0]
            .driver_sha256,
        None
    );
    for bad in [
        "sha256:4c09",
        &digest[..63],
        &format!("{digest}0"),
        &"g".repeat(64),
    ] {
        check(
            &pinned(bad),
            &[("providers.sim-a.driver-sha256", "64 hex digits")],
        );
    }
}

#[test]
fn a_pinned_file_with_other_bytes_is_a_problem_naming_both_digests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("plugins/sim.wasm");
    std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
    std::fs::write(&file, b"abc").expect("write");
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert_eq!(file_sha256(&file).expect("reads"), abc);
    let text = |pin: &str| {
        GOOD.replace(
            "driver = \"sim.wasm\"\n",
            &format!("driver = \"sim.wasm\"\ndriver-sha256 = \"{pin}\"\n"),
        )
    };
    let c = parse(&text(abc), dir.path(), &env).expect("valid");
    assert!(check_files(&c).is_empty(), "{:?}", check_files(&c));
    let other = "0".repeat(64);
    let c = parse(&text(&other), dir.path(), &env).expect("valid");
    let problems = check_files(&c);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "providers.sim-a.driver-sha256");
    assert!(
        problems[0].message.contains(abc) && problems[0].message.contains(&other),
        "{}",
        problems[0].message
    );
}

/// What a reload of GOOD edited would change: each key with old and new,
/// live or not; secrets said to have changed, never shown.
#[test]
fn a_reload_names_each_difference_and_whether_it_can_change_live() {
    let parsed = |text: &str| parse(text, Path::new("/etc/berth"), &env).expect("valid");
    let running = parsed(GOOD);
    assert!(differences(&running, &running).is_empty());
    let edited = GOOD
        .replace("pool-id = \"ci\"", "pool-id = \"cd\"")
        .replace("sync-interval = \"30s\"", "sync-interval = \"1500ms\"")
        .replace("min-ready = 2", "min-ready = 5")
        .replace("rate = 2.5", "rate = 4")
        .replace("${SIM_TOKEN}", "${CI_TOKEN}")
        + r#"
[labels.small]
[labels.small.providers.sim-a]
instance-type = "small"
image = "ubuntu"
vcpus = 1
ram = "1GiB"
"#;
    let got: Vec<String> = (differences(&running, &parsed(&edited)).iter())
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            "pool-id: ci → cd (cannot change while berth runs: restart it)",
            "sync-interval: 30s → 1500ms",
            "providers.sim-a.rate: 2.5 → 4",
            // Its default follows the rate.
            "providers.sim-a.burst: 3 → 4",
            "providers.sim-a.config: changed",
            "labels.big.min-ready: 2 → 5",
            "labels.small: added",
        ],
        "{got:#?}"
    );
    assert!(
        !got.iter()
            .any(|l| l.contains("s3cret") || l.contains("ci-token"))
    );
    let removed = GOOD.replace("[labels.slot]\nslots = 4\nbacking-label = \"big\"\n", "");
    let got: Vec<String> = (differences(&running, &parsed(&removed)).iter())
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            "labels.slot: removed: it is asked for no more, and its nodes are drained (deleted once idle)"
        ]
    );
}

/// A reload's settings keep the running labels' and providers' indexes,
/// whatever order the new file writes them in; what cannot change live,
/// and what is not yet taken live, refuses the reload as a whole.
#[test]
fn a_reload_keeps_running_indexes_or_is_refused_with_every_reason() {
    let parsed = |text: &str| parse(text, Path::new("/etc/berth"), &env).expect("valid");
    let with_b = |text: &str| {
        text.replace(
            "[labels.big]\n",
            "[providers.sim-b]\ndriver = \"sim.wasm\"\n\n[labels.big]\n",
        ) + "[labels.big.providers.sim-b]\ninstance-type = \"b\"\nimage = \"u\"\nvcpus = 1\nram = \"1GiB\"\n"
    };
    let running = parsed(&with_b(GOOD));
    // The new file: sim-b first, a label `small` before the others, and
    // the slot label before its backing label.
    let small = "[labels.small]\nmin-ready = 3\n[labels.small.providers.sim-b]\n\
                 instance-type = \"s\"\nimage = \"u\"\nvcpus = 1\nram = \"1GiB\"\n\n";
    let slot = "[labels.slot]\nslots = 4\nbacking-label = \"big\"\n";
    let text = with_b(GOOD).replace(slot, "");
    let b_table = "[providers.sim-b]\ndriver = \"sim.wasm\"\n\n";
    let text = text.replace(b_table, "").replace(
        "[providers.sim-a]",
        &format!("{b_table}{small}{slot}\n[providers.sim-a]"),
    );
    let new = parsed(&text);
    assert_eq!(new.pool.labels[0].name, "small", "{text}");
    assert_eq!(new.pool.providers[0].name, "sim-b", "{text}");

    let aligned = align(&running, new).expect("a live change");
    let names =
        |s: &Settings| -> Vec<String> { s.pool.labels.iter().map(|l| l.name.clone()).collect() };
    assert_eq!(names(&aligned), ["big", "slot", "small"]);
    let providers: Vec<&str> = (aligned.pool.providers.iter())
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(providers, ["sim-a", "sim-b"]);
    assert_eq!(aligned.pool.providers[0].rate, Some(2.5), "settings follow");
    assert_eq!(aligned.drivers.len(), 2);
    match &aligned.pool.labels[1].kind {
        LabelKind::Slots { backing, .. } => assert_eq!(*backing, LabelIx(0)),
        other => panic!("{other:?}"),
    }
    let offers = |ix: usize| match &aligned.pool.labels[ix].kind {
        LabelKind::Machine { offers } => {
            let mut v: Vec<(u16, String)> = (offers.iter())
                .map(|o| (o.provider.0, o.instance_type.clone()))
                .collect();
            v.sort();
            v
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(offers(0), [(0, "big".to_owned()), (1, "b".to_owned())]);
    assert_eq!(offers(2), [(1, "s".to_owned())]);
    assert_eq!(aligned.pool.labels[2].min_ready, 3);
    assert!(differences(&aligned, &parsed(&text)).is_empty());

    // A label removed stays at its index, retired, until berth stops; a
    // reload that no longer has it either changes nothing, and one that
    // has it again brings it back.
    let removed = align(&running, parsed(&with_b(GOOD).replace(slot, ""))).expect("live");
    assert_eq!(names(&removed), ["big", "slot"]);
    assert!(!removed.pool.labels[0].retired && removed.pool.labels[1].retired);
    assert_eq!(
        removed.pool.labels[1].kind, running.pool.labels[1].kind,
        "kept as it ran"
    );
    let differences_from = |s: &Settings, text: &str| -> Vec<String> {
        (differences(s, &parsed(text)).iter())
            .map(ToString::to_string)
            .collect()
    };
    assert!(differences_from(&removed, &with_b(GOOD).replace(slot, "")).is_empty());
    assert_eq!(
        differences_from(&removed, &with_b(GOOD)),
        ["labels.slot: added"]
    );
    let back = align(&removed, parsed(&with_b(GOOD))).expect("live");
    assert_eq!(names(&back), ["big", "slot"]);
    assert!(!back.pool.labels[1].retired);

    // A provider removed stays at its index, retired, and one added
    // follows the running ones, with the offers that name it.
    let swapped = with_b(GOOD)
        .replace("[providers.sim-b]", "[providers.sim-c]")
        .replace(
            "[labels.big.providers.sim-b]",
            "[labels.big.providers.sim-c]",
        );
    let moved = align(&running, parsed(&swapped)).expect("live");
    let providers: Vec<(&str, bool)> = (moved.pool.providers.iter())
        .map(|p| (p.name.as_str(), p.retired))
        .collect();
    assert_eq!(
        providers,
        [("sim-a", false), ("sim-b", true), ("sim-c", false)]
    );
    assert_eq!(moved.drivers.len(), 3);
    match &moved.pool.labels[0].kind {
        LabelKind::Machine { offers } => {
            let mut at: Vec<u16> = offers.iter().map(|o| o.provider.0).collect();
            at.sort();
            assert_eq!(at, [0, 2]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        differences_from(&moved, &with_b(GOOD)),
        [
            "providers.sim-c: removed: no label offers it, and its nodes are drained (deleted once idle)",
            "providers.sim-b: added",
            "labels.big.providers.sim-c: removed",
            "labels.big.providers.sim-b: added"
        ]
    );

    // Refused, with every reason at once.
    let slot_on_b = "[labels.slot]\nslots = 4\nbacking-label = \"small\"\n";
    let bad = with_b(GOOD)
        .replace("pool-id = \"ci\"", "pool-id = \"cd\"")
        .replace(slot, &format!("{slot_on_b}\n{small}"))
        .replace(
            "[providers.sim-a]",
            "[providers.sim-c]\ndriver = \"sim.wasm\"\n\n[providers.sim-a]",
        );
    let Err(why) = align(&running, parsed(&bad)) else {
        panic!("refused")
    };
    assert_eq!(
        why,
        [
            "pool-id: ci → cd (cannot change while berth runs: restart it)",
            "labels.slot: its kind or backing label changed: not yet while berth runs: restart it",
        ],
        "{why:#?}"
    );
}

/// The fleet's digest is what the processes on one store must run alike:
/// a reloaded file and the same file read at start agree, whatever the
/// order of its tables; a change the pool decides with changes it, and
/// what is each process's own does not.
#[test]
fn the_fleet_digest_follows_meaning_not_arrangement_nor_what_is_each_processs_own() {
    let parsed = |text: &str| parse(text, Path::new("/etc/berth"), &env).expect("valid");
    let small = "[labels.small]\nmin-ready = 1\n[labels.small.providers.sim-a]\n\
                 instance-type = \"s\"\nimage = \"u\"\nvcpus = 1\nram = \"1GiB\"\n\n";
    let tokens = "[api.tokens.ci]\nrole = \"client\"\ntoken = \"ci-secret-0123456789\"\n\n";
    let base = format!("{GOOD}\n{small}{tokens}");
    let digest = fleet_digest(&parsed(&base));
    assert_eq!(digest.len(), 64);

    // The labels in another order; a reload of it onto a running pool
    // that had one more label, since removed (retired, kept at its index).
    let reordered = format!(
        "pool-id = \"ci\"\nsync-interval = \"30s\"\n\n{tokens}{small}{}",
        GOOD.replace("pool-id = \"ci\"\nsync-interval = \"30s\"\n", "")
    );
    assert_eq!(fleet_digest(&parsed(&reordered)), digest, "{reordered}");
    let extra = "[labels.extra]\n[labels.extra.providers.sim-a]\n\
                 instance-type = \"x\"\nimage = \"u\"\nvcpus = 1\nram = \"1GiB\"\n\n";
    let running = parsed(&format!("{base}{extra}"));
    assert_ne!(fleet_digest(&running), digest);
    let aligned = align(&running, parsed(&reordered)).expect("live");
    assert!(aligned.pool.labels.iter().any(|l| l.retired));
    assert_eq!(fleet_digest(&aligned), digest);

    // Each process's own: where it listens, its state, its driver's
    // settings.
    let own = base
        .replace(
            "sync-interval = \"30s\"\n",
            "sync-interval = \"30s\"\nstate-dir = \"/srv/b\"\n[api]\nlisten = \"127.0.0.1:9\"\n",
        )
        .replace("http://127.0.0.1:8600\"", "http://127.0.0.1:8601\"");
    assert_ne!(
        parsed(&own).drivers[0].driver_config,
        parsed(&base).drivers[0].driver_config
    );
    assert_eq!(fleet_digest(&parsed(&own)), digest, "{own}");

    // What the pool decides with, and who may call it.
    for (from, to) in [
        ("min-ready = 1", "min-ready = 2"),
        ("price = 0.4", "price = 0.5"),
        ("max-instances = 50", "max-instances = 49"),
        ("slots = 4", "slots = 3"),
        ("ci-secret-0123456789", "ci-secret-0123456780"),
        ("role = \"client\"", "role = \"admin\""),
    ] {
        let changed = base.replace(from, to);
        assert_ne!(changed, base, "{from}");
        assert_ne!(fleet_digest(&parsed(&changed)), digest, "{from} → {to}");
    }
}

#[test]
fn caps_schedules_and_burst_extra_are_read_and_their_faults_named() {
    // The windows' tables come last in `[labels.big]`: keys after them
    // would be theirs.
    let text = GOOD.replace(
        "max-ready-age = \"1h\"\n",
        "max-ready-age = \"1h\"\nmax-nodes = 10\nburst-extra = 3\n\
         [[labels.big.schedule]]\ndays = [\"mon\", \"Fri\"]\nfrom = \"08:00\"\n\
         to = \"12:30:15\"\nmin-ready = 6\n[[labels.big.schedule]]\nfrom = \"22:00\"\n\
         to = \"02:00\"\nmin-ready = 1\n",
    );
    let text = format!(
        "{text}\n[api.tokens.ci]\nrole = \"client\"\ntoken = \"0123456789abcdef0123\"\nmax-nodes = 4\n"
    );
    let settings = parse(&text, Path::new("/etc/berth"), &env).unwrap();
    let big = &settings.pool.labels[settings.pool.label("big").unwrap().0 as usize];
    assert_eq!(big.max_nodes, Some(10));
    assert_eq!(big.burst_extra, 3);
    assert_eq!(
        big.schedule,
        [
            berth_core::config::Window {
                days: 0b001_0001,
                from: 8 * 3600,
                to: 12 * 3600 + 30 * 60 + 15,
                min_ready: 6
            },
            berth_core::config::Window {
                days: 0b111_1111,
                from: 22 * 3600,
                to: 2 * 3600,
                min_ready: 1
            }
        ]
    );
    // As `config check --against` shows a change of it.
    assert_eq!(
        big.schedule[0].to_string(),
        "mon,fri 08:00:00-12:30:15 min-ready 6"
    );
    assert_eq!(settings.pool.requestor_caps.get("ci"), Some(&4));

    let label = "pool-id = \"p\"\n[providers.a]\ndriver = \"a.wasm\"\n[labels.x]\n";
    let offer = "[labels.x.providers.a]\ninstance-type = \"t\"\nimage = \"i\"\nvcpus = 1\n\
                 ram = \"1GiB\"\n";
    check(
        &format!(
            "{label}max-nodes = 0\nburst-extra = -1\n[[labels.x.schedule]]\ndays = [\"someday\"]\n\
             from = \"25:00\"\nto = \"8:00\"\n[[labels.x.schedule]]\nfrom = \"08:00\"\n\
             to = \"08:00\"\nmin-ready = 1\n{offer}"
        ),
        &[
            ("labels.x.max-nodes", "1 or more"),
            ("labels.x.burst-extra", "out of range"),
            ("labels.x.schedule[0].days", "`\"someday\"` is not a day"),
            ("labels.x.schedule[0].from", "not a time of day"),
            ("labels.x.schedule[0].to", "not a time of day"),
            ("labels.x.schedule[0].min-ready", "missing"),
            ("labels.x.schedule[1]", "the same time"),
        ],
    );
}
