//! The deployment files, held against the image and the gateway: the
//! compose file as `docker-compose config` reads it, and the Kubernetes
//! manifests as `kubectl kustomize` renders them. No container engine or
//! cluster runs here, so these check structure — the wiring between the
//! files, the image's paths and the gateway's configuration — not a
//! running fleet.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize as _;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The path of the tollgate binary in the image, from the Dockerfile's
/// `COPY --from=build … <path>` line.
fn image_binary() -> String {
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let line = dockerfile
        .lines()
        .find(|l| l.starts_with("COPY --from=build"))
        .expect("the Dockerfile copies the binary from the build stage");
    line.split_whitespace()
        .last()
        .expect("a destination")
        .to_owned()
}

/// The Dockerfile's `USER` (uid) and the admin port of its `CMD`.
fn image_user_and_admin_port() -> (u64, u16) {
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let user = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .and_then(|u| u.split(':').next())
        .and_then(|u| u.trim().parse().ok())
        .expect("a numeric USER");
    let cmd = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD");
    let args: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    let admin = args
        .iter()
        .position(|a| a == "--admin")
        .and_then(|i| args.get(i + 1))
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .expect("CMD names --admin");
    (user, admin.port())
}

/// A YAML text as JSON values, one per document.
fn documents(text: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v:#}"))
        .to_owned()
}

/// A compose duration (`15s`, `1m30s`) or a configuration one (`30s`).
fn duration(s: &str) -> Duration {
    let mut total = Duration::ZERO;
    let mut number = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().unwrap_or_else(|_| panic!("duration {s:?}"));
        number.clear();
        total += match c {
            's' => Duration::from_secs(n),
            'm' => Duration::from_secs(n * 60),
            'h' => Duration::from_secs(n * 3600),
            _ => panic!("duration {s:?}"),
        };
    }
    assert!(number.is_empty(), "duration {s:?} without a unit");
    total
}

/// Runs `program` with `args` in `dir`; its stdout. `None` when the program
/// is not installed.
fn run(program: &str, args: &[&str], dir: &Path) -> Option<String> {
    let out = match Command::new(program).args(args).current_dir(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("cannot run {program}: {e}"),
    };
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).expect("UTF-8 output"))
}

/// The host of a `scheme://host:port` URL.
fn host_of(url: &str) -> String {
    let uri: http::Uri = url.parse().unwrap_or_else(|_| panic!("URL {url:?}"));
    uri.host().expect("a host").to_owned()
}

#[test]
fn compose_file_passes_docker_compose_config_and_wires_the_fleet() {
    let root = Path::new(ROOT);
    let Some(rendered) = run("docker-compose", &["-f", "compose.yaml", "config"], root) else {
        panic!(
            "docker-compose is not installed: scripts/test.sh installs it (Debian package docker-compose)"
        );
    };
    let compose = documents(&rendered).remove(0);
    let services = compose["services"].as_object().expect("services");
    let mut names: Vec<&str> = services.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["gateway-a", "gateway-b", "redis", "upstream"]);

    let binary = image_binary();
    let (_, admin_port) = image_user_and_admin_port();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("CMD [\"{binary}\", \"health\", \"--ready\"]")),
        "the image's HEALTHCHECK runs tollgate health --ready"
    );
    // `tollgate health` asks the address the image serves the admin
    // listener on when it is given none.
    let default_admin: http::Uri = tollgate::admin::probe::DEFAULT_ADMIN.parse().unwrap();
    assert_eq!(default_admin.port_u16(), Some(admin_port));

    let mut published = Vec::new();
    for name in ["gateway-a", "gateway-b", "upstream"] {
        let s = &services[name];
        assert_eq!(
            s["healthcheck"]["test"],
            serde_json::json!(["CMD", binary, "health", "--ready"]),
            "{name}"
        );
        assert_eq!(s["build"]["context"].as_str(), Some(ROOT), "{name}");
        assert_eq!(s["read_only"], Value::Bool(true), "{name}");
        assert_eq!(s["cap_drop"], serde_json::json!(["ALL"]), "{name}");

        // The configuration directory mounted at /etc/tollgate, and the
        // file the container serves from it.
        let volume = s["volumes"][0].as_str().expect("a bind mount");
        let parts: Vec<&str> = volume.split(':').collect();
        assert_eq!(parts[1..], ["/etc/tollgate", "ro"], "{name}: {volume}");
        let config_dir = PathBuf::from(parts[0]);
        let file = match s.get("command") {
            Some(cmd) => {
                let args: Vec<&str> = cmd
                    .as_array()
                    .expect("command in exec form")
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                let i = args
                    .iter()
                    .position(|a| *a == "--config")
                    .expect("--config");
                assert!(
                    args.windows(2)
                        .any(|w| w == ["--admin", &format!("0.0.0.0:{admin_port}")]),
                    "{name}: the health check asks the admin port: {args:?}"
                );
                args[i + 1].to_owned()
            }
            None => "/etc/tollgate/gateway.yaml".to_owned(),
        };
        let file = config_dir.join(file.strip_prefix("/etc/tollgate/").expect("in the mount"));
        let config = tollgate::config::load::load_file(&file)
            .unwrap_or_else(|e| panic!("{name}: {} does not load:\n{e}", file.display()));
        let yaml = documents(&std::fs::read_to_string(&file).unwrap()).remove(0);

        if name == "upstream" {
            assert!(config.store.redis.is_none());
            assert!(
                s.get("ports").is_none(),
                "the upstream is reached through the gateways"
            );
            continue;
        }
        // The gateways share one Redis, the compose service, and forward to
        // the upstream service; they start once both are healthy.
        let redis = config.store.redis.as_ref().expect("the gateways use Redis");
        assert_eq!(host_of(&redis.url), "redis");
        let forwards: Vec<String> = yaml["routes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["upstream"].as_str().map(host_of))
            .collect();
        assert_eq!(forwards, ["upstream"], "{name}");
        for dep in ["redis", "upstream"] {
            assert_eq!(
                s["depends_on"][dep]["condition"], "service_healthy",
                "{name} waits for {dep}"
            );
        }
        // The stop grace covers the drain.
        let grace = duration(&text(s, "/stop_grace_period"));
        assert!(
            grace > config.timeouts.drain,
            "{name}: stop_grace_period {grace:?} <= drain {:?}",
            config.timeouts.drain
        );
        for port in s["ports"].as_array().expect("ports") {
            published.push(port.clone());
        }
    }
    // The two gateways' proxy ports are published side by side, and their
    // admin ports on loopback only.
    let proxies: Vec<u64> = published
        .iter()
        .filter(|p| p["target"] == 8080)
        .filter_map(|p| p["published"].as_u64())
        .collect();
    assert_eq!(proxies, [8080, 8081], "{published:?}");
    let admins: Vec<&str> = published.iter().filter_map(Value::as_str).collect();
    assert_eq!(
        admins,
        ["127.0.0.1:9090:9090/tcp", "127.0.0.1:9091:9090/tcp"],
        "{published:?}"
    );
}

/// The rendered objects of `kubectl kustomize dir`, by kind and name (a
/// generated name without its hash suffix); `None` without kubectl.
fn kustomize(dir: &Path) -> Option<Vec<Value>> {
    run(
        "kubectl",
        &["kustomize", &dir.to_string_lossy()],
        Path::new(ROOT),
    )
    .map(|s| documents(&s))
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n == name || n.starts_with(&format!("{name}-")))
        })
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn kubernetes_manifests_render_with_probes_security_and_a_rolling_config() {
    let dir = Path::new(ROOT).join("deploy/kubernetes");
    let Some(objects) = kustomize(&dir) else {
        // scripts/test.sh says so too; kubectl is not a Debian package.
        crate::support::skip::skipped(
            "kubectl is not installed, so deploy/kubernetes is not rendered",
        );
        return;
    };
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| format!("{}/{}", text(o, "/kind"), text(o, "/metadata/name")))
        .collect();
    kinds.sort();
    assert_eq!(kinds.len(), 6, "{kinds:?}");

    let deployment = object(&objects, "Deployment", "tollgate");
    let pod = &deployment["spec"]["template"]["spec"];
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], pod_labels);
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let arg = |flag: &str| {
        let i = args
            .iter()
            .position(|a| *a == flag)
            .unwrap_or_else(|| panic!("{flag}"));
        args[i + 1]
    };

    // Probes: readiness on /readyz, liveness on /healthz, both on the
    // admin port the arguments serve.
    let port = |name: &str| -> u64 {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("port {name}"))
    };
    let admin: std::net::SocketAddr = arg("--admin").parse().unwrap();
    let listen: std::net::SocketAddr = arg("--listen").parse().unwrap();
    assert_eq!(port("admin"), u64::from(admin.port()));
    assert_eq!(port("http"), u64::from(listen.port()));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "admin");

    // Security: the image's non-root user, nothing writable, nothing gained.
    let (uid, _) = image_user_and_admin_port();
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], uid);
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    for resource in ["cpu", "memory"] {
        assert!(
            c["resources"]["requests"][resource].is_string(),
            "no {resource} request"
        );
    }

    // The configuration: the generated ConfigMap (its name carries a hash
    // of the file), mounted where --config reads it.
    let config_map = object(&objects, "ConfigMap", "tollgate-config");
    let config_name = text(config_map, "/metadata/name");
    assert_ne!(config_name, "tollgate-config", "generated, with a hash");
    let volume = |name: &str| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volume {name}"))
    };
    let mount = |name: &str| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .map(|m| (text(m, "/mountPath"), m["readOnly"] == true))
            .unwrap_or_else(|| panic!("mount {name}"))
    };
    assert_eq!(volume("config")["configMap"]["name"], config_name.as_str());
    let config_file = Path::new(arg("--config"));
    let (config_dir, read_only) = mount("config");
    assert!(read_only);
    assert_eq!(config_file.parent(), Some(Path::new(&config_dir)));
    let file_name = config_file.file_name().unwrap().to_string_lossy();
    let gateway_yaml = text(config_map, &format!("/data/{file_name}"));

    // The Redis password: a Secret's key, mounted as the file the
    // configuration names.
    let secret = object(&objects, "Secret", "tollgate-redis");
    let secret_volume = volume("redis-password");
    assert_eq!(
        secret_volume["secret"]["secretName"],
        text(secret, "/metadata/name").as_str()
    );
    let (secret_dir, read_only) = mount("redis-password");
    assert!(read_only);
    let mut gateway = documents(&gateway_yaml).remove(0);
    let password_file = text(&gateway, "/store/redis/password_file");
    let key = Path::new(&password_file)
        .strip_prefix(&secret_dir)
        .unwrap_or_else(|_| panic!("{password_file} is not under {secret_dir}"))
        .to_string_lossy()
        .into_owned();
    assert!(secret["data"][&key].is_string(), "the Secret has no {key}");
    // The group can read it: the pod's fsGroup owns the Secret's files.
    assert_eq!(secret_volume["secret"]["defaultMode"], 0o440);
    assert_eq!(pod["securityContext"]["fsGroup"], uid);

    // The rest of the file loads; `password_file` is read when a file
    // loads and exists only in the pod, so it is checked above by where it
    // points.
    gateway["store"]["redis"]
        .as_object_mut()
        .unwrap()
        .remove("password_file");
    let without = yaml_serde::to_string(&gateway).unwrap();
    let config = tollgate::config::load::parse_str(&without)
        .unwrap_or_else(|e| panic!("deploy/kubernetes/gateway.yaml does not load:\n{e}"));

    // Termination: the preStop pause, then the drain, within the grace.
    let pause: Vec<&str> = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("a preStop command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(pause[..1], ["/bin/sleep"]);
    let pause = Duration::from_secs(pause[1].parse().expect("seconds"));
    let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap());
    assert!(
        grace > pause + config.timeouts.drain,
        "grace {grace:?} <= preStop {pause:?} + drain {:?}",
        config.timeouts.drain
    );

    // The proxy Service keeps the client's address and does not expose the
    // admin listener; the admin one stays inside the cluster.
    let service = object(&objects, "Service", "tollgate");
    assert_eq!(service["spec"]["externalTrafficPolicy"], "Local");
    assert_eq!(&service["spec"]["selector"], pod_labels);
    let targets: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["targetPort"])
        .collect();
    assert_eq!(targets, [&Value::from("http")]);
    let admin_service = object(&objects, "Service", "tollgate-admin");
    assert_eq!(admin_service["spec"]["type"], "ClusterIP");
    assert_eq!(admin_service["spec"]["ports"][0]["targetPort"], "admin");
    assert_eq!(&admin_service["spec"]["selector"], pod_labels);

    // The disruption budget covers the pods and leaves one running.
    let pdb = object(&objects, "PodDisruptionBudget", "tollgate");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels);
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
    let unavailable = pdb["spec"]["maxUnavailable"].as_u64().unwrap();
    assert!(unavailable < replicas);

    // A changed gateway.yaml is a new ConfigMap name in the pod template,
    // so applying it rolls the pods.
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
    }
    let edited = std::fs::read_to_string(copy.path().join("gateway.yaml")).unwrap() + "# edited\n";
    std::fs::write(copy.path().join("gateway.yaml"), edited).unwrap();
    let changed = kustomize(copy.path()).expect("kubectl ran once already");
    let rolled = object(&changed, "Deployment", "tollgate");
    let new_name = &rolled["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"];
    assert!(
        new_name
            .as_str()
            .is_some_and(|n| n.starts_with("tollgate-config-"))
    );
    assert_ne!(new_name, config_name.as_str(), "the pod template changed");
}
