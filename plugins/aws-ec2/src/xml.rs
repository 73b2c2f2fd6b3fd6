//! EC2's XML responses read into the contract's types. Elements are matched
//! by local name (EC2 puts its responses in a namespace, its error bodies
//! not always), by path from the root, never by searching descendants: an
//! instance's network interfaces have `item`s and `tagSet`s of their own.

use berth_sdk::types::{Addresses, Connection, Instance, InstanceState};
use roxmltree::{Document, Node};

use berth_sdk::time;

/// One `DescribeInstances` page.
#[derive(Debug)]
pub(crate) struct Page {
    pub instances: Vec<Instance>,
    pub next_token: Option<String>,
}

/// One entry of a `TerminateInstances` answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct StateChange {
    pub instance_id: String,
    pub previous: String,
    pub current: String,
}

/// An EC2 error body: `<Response><Errors><Error><Code>`…
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub code: String,
    pub message: String,
    pub request_id: Option<String>,
}

fn parse(body: &str) -> Result<Document<'_>, String> {
    Document::parse(body).map_err(|e| format!("malformed XML from EC2: {e}"))
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

/// The element at `path` below `node`.
fn at<'a, 'i>(node: Node<'a, 'i>, path: &[&str]) -> Option<Node<'a, 'i>> {
    path.iter().try_fold(node, |n, name| child(n, name))
}

/// The trimmed text at `path`, `None` when absent or empty.
fn text<'a>(node: Node<'a, '_>, path: &[&str]) -> Option<&'a str> {
    at(node, path)?
        .text()
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The `<item>` children of the set at `path`.
fn items<'a, 'i>(node: Node<'a, 'i>, path: &[&str]) -> impl Iterator<Item = Node<'a, 'i>> {
    at(node, path)
        .into_iter()
        .flat_map(|set| set.children())
        .filter(|c| c.is_element() && c.tag_name().name() == "item")
}

/// The root element, checked to be the answer to `action`.
fn root<'a, 'i>(doc: &'a Document<'i>, action: &str) -> Result<Node<'a, 'i>, String> {
    let root = doc.root_element();
    let want = format!("{action}Response");
    if root.tag_name().name() == want {
        Ok(root)
    } else {
        Err(format!(
            "EC2 answered {action} with <{}>, expected <{want}>",
            root.tag_name().name()
        ))
    }
}

/// An EC2 instance state name as the contract's state.
///
/// berth never stops instances, and launches them with
/// `InstanceInitiatedShutdownBehavior=terminate`; an instance that stops
/// anyway (an operator, or a Spot interruption configured elsewhere) serves
/// nobody, so `stopping` and `stopped` read as `stopping`.
pub(crate) fn state(name: &str) -> InstanceState {
    match name {
        "pending" => InstanceState::Pending,
        "running" => InstanceState::Running,
        "shutting-down" | "stopping" | "stopped" => InstanceState::Stopping,
        "terminated" => InstanceState::Terminated,
        _ => InstanceState::Unknown,
    }
}

/// One `instancesSet/item`.
fn instance(item: Node<'_, '_>) -> Result<Instance, String> {
    let id = text(item, &["instanceId"]).ok_or("an instance without instanceId")?;
    let tags = items(item, &["tagSet"])
        .filter_map(|t| {
            let key = at(t, &["key"])?.text().unwrap_or_default();
            let value = at(t, &["value"]).and_then(|v| v.text()).unwrap_or_default();
            Some((key.to_owned(), value.to_owned()))
        })
        .collect();
    // The primary interface's first IPv6 address, where the instance-level
    // `ipv6Address` (newer responses) is absent.
    let ipv6 = text(item, &["ipv6Address"]).map(str::to_owned).or_else(|| {
        let mut interfaces: Vec<Node<'_, '_>> = items(item, &["networkInterfaceSet"]).collect();
        interfaces.sort_by_key(|n| text(*n, &["attachment", "deviceIndex"]) != Some("0"));
        interfaces.iter().find_map(|n| {
            items(*n, &["ipv6AddressesSet"])
                .find_map(|a| text(a, &["ipv6Address"]))
                .map(str::to_owned)
        })
    });
    let owned = |path: &[&str]| text(item, path).map(str::to_owned);
    Ok(Instance {
        id: id.to_owned(),
        state: text(item, &["instanceState", "name"]).map_or(InstanceState::Unknown, state),
        instance_type: owned(&["instanceType"]).unwrap_or_default(),
        tags,
        addresses: Addresses {
            public_ipv4: owned(&["ipAddress"]),
            private_ipv4: owned(&["privateIpAddress"]),
            ipv6,
            hostname: owned(&["dnsName"]).or_else(|| owned(&["privateDnsName"])),
        },
        created_at_ms: text(item, &["launchTime"]).and_then(time::parse_ms),
        connection: Connection {
            username: None,
            port: None,
            host_keys: vec![],
        },
    })
}

/// A `DescribeInstances` answer: every instance of every reservation.
pub(crate) fn describe_instances(body: &str) -> Result<Page, String> {
    let doc = parse(body)?;
    let root = root(&doc, "DescribeInstances")?;
    let mut instances = Vec::new();
    for reservation in items(root, &["reservationSet"]) {
        for item in items(reservation, &["instancesSet"]) {
            instances.push(instance(item)?);
        }
    }
    Ok(Page {
        instances,
        next_token: text(root, &["nextToken"]).map(str::to_owned),
    })
}

/// A `RunInstances` answer for one instance.
pub(crate) fn run_instances(body: &str) -> Result<Instance, String> {
    let doc = parse(body)?;
    let root = root(&doc, "RunInstances")?;
    let mut launched = items(root, &["instancesSet"]);
    let first = launched
        .next()
        .ok_or("RunInstances answered with no instance")?;
    if launched.next().is_some() {
        return Err("RunInstances answered with more than one instance".into());
    }
    instance(first)
}

/// A `TerminateInstances` answer.
pub(crate) fn terminate_instances(body: &str) -> Result<Vec<StateChange>, String> {
    let doc = parse(body)?;
    let root = root(&doc, "TerminateInstances")?;
    items(root, &["instancesSet"])
        .map(|item| {
            Ok(StateChange {
                instance_id: text(item, &["instanceId"])
                    .ok_or("a state change without instanceId")?
                    .to_owned(),
                previous: text(item, &["previousState", "name"])
                    .unwrap_or_default()
                    .to_owned(),
                current: text(item, &["currentState", "name"])
                    .unwrap_or_default()
                    .to_owned(),
            })
        })
        .collect()
}

/// The root device name of the one image a `DescribeImages` answer holds;
/// `Ok(None)` when it holds none.
pub(crate) fn root_device_name(body: &str) -> Result<Option<String>, String> {
    let doc = parse(body)?;
    let root = root(&doc, "DescribeImages")?;
    match items(root, &["imagesSet"]).next() {
        None => Ok(None),
        Some(image) => text(image, &["rootDeviceName"])
            .map(|n| Some(n.to_owned()))
            .ok_or_else(|| "DescribeImages answered with an image without rootDeviceName".into()),
    }
}

/// Checks that a body is the answer to `action` (for calls whose answer
/// carries nothing else: `CreateTags`, `DeleteTags`).
pub(crate) fn acknowledged(body: &str, action: &str) -> Result<(), String> {
    let doc = parse(body)?;
    root(&doc, action).map(|_| ())
}

/// The first error of an EC2 error body, if the body is one.
pub(crate) fn api_error(body: &str) -> Option<ApiError> {
    let doc = Document::parse(body).ok()?;
    let root = doc.root_element();
    // `<Response><Errors><Error>`; some front ends answer `<ErrorResponse><Error>`.
    let error = match root.tag_name().name() {
        "Response" => at(root, &["Errors", "Error"])?,
        "ErrorResponse" => at(root, &["Error"])?,
        _ => return None,
    };
    Some(ApiError {
        code: text(error, &["Code"])?.to_owned(),
        message: text(error, &["Message"]).unwrap_or_default().to_owned(),
        request_id: text(root, &["RequestID"])
            .or_else(|| text(root, &["RequestId"]))
            .map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DescribeInstances page as EC2 writes it: two reservations, one
    /// with two instances; network interfaces with tags and items of their
    /// own that must not be mistaken for the instance's.
    const DESCRIBE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
  <reservationSet>
    <item>
      <reservationId>r-1</reservationId>
      <ownerId>123456789012</ownerId>
      <groupSet/>
      <instancesSet>
        <item>
          <instanceId>i-0aaa</instanceId>
          <imageId>ami-1</imageId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-10-0-0-12.ec2.internal</privateDnsName>
          <dnsName>ec2-54-1-2-3.compute-1.amazonaws.com</dnsName>
          <instanceType>t3.micro</instanceType>
          <launchTime>2024-05-01T12:34:56.000Z</launchTime>
          <privateIpAddress>10.0.0.12</privateIpAddress>
          <ipAddress>54.1.2.3</ipAddress>
          <networkInterfaceSet>
            <item>
              <networkInterfaceId>eni-2</networkInterfaceId>
              <attachment><deviceIndex>1</deviceIndex></attachment>
              <ipv6AddressesSet><item><ipv6Address>2600:1f18::2</ipv6Address></item></ipv6AddressesSet>
              <tagSet><item><key>eni</key><value>second</value></item></tagSet>
            </item>
            <item>
              <networkInterfaceId>eni-1</networkInterfaceId>
              <attachment><deviceIndex>0</deviceIndex></attachment>
              <ipv6AddressesSet><item><ipv6Address>2600:1f18::1</ipv6Address></item></ipv6AddressesSet>
            </item>
          </networkInterfaceSet>
          <tagSet>
            <item><key>berth-pool</key><value>p1</value></item>
            <item><key>berth-node</key><value>n-0000000000000001</value></item>
            <item><key>empty</key><value/></item>
            <item><key>amp</key><value>a &amp; b</value></item>
          </tagSet>
        </item>
        <item>
          <instanceId>i-0bbb</instanceId>
          <instanceState><code>32</code><name>shutting-down</name></instanceState>
          <privateDnsName>ip-10-0-0-13.ec2.internal</privateDnsName>
          <dnsName/>
          <instanceType>t3.micro</instanceType>
          <launchTime>2024-05-01T12:35:00.000Z</launchTime>
          <ipv6Address>2600:1f18::9</ipv6Address>
          <tagSet><item><key>berth-pool</key><value>p1</value></item></tagSet>
        </item>
      </instancesSet>
    </item>
    <item>
      <reservationId>r-2</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-0ccc</instanceId>
          <instanceState><code>48</code><name>terminated</name></instanceState>
          <instanceType>m7g.large</instanceType>
          <launchTime>garbage</launchTime>
        </item>
      </instancesSet>
    </item>
  </reservationSet>
  <nextToken>eyJ2IjoiMiJ9</nextToken>
</DescribeInstancesResponse>"#;

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn reads_describe_instances() {
        let page = describe_instances(DESCRIBE).expect("parses");
        assert_eq!(page.next_token.as_deref(), Some("eyJ2IjoiMiJ9"));
        let ids: Vec<&str> = page.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["i-0aaa", "i-0bbb", "i-0ccc"]);

        let a = &page.instances[0];
        assert_eq!(a.state, InstanceState::Running);
        assert_eq!(a.instance_type, "t3.micro");
        assert_eq!(
            a.tags,
            t(&[
                ("berth-pool", "p1"),
                ("berth-node", "n-0000000000000001"),
                ("empty", ""),
                ("amp", "a & b")
            ])
        );
        assert_eq!(a.addresses.public_ipv4.as_deref(), Some("54.1.2.3"));
        assert_eq!(a.addresses.private_ipv4.as_deref(), Some("10.0.0.12"));
        assert_eq!(
            a.addresses.ipv6.as_deref(),
            Some("2600:1f18::1"),
            "primary interface first"
        );
        assert_eq!(
            a.addresses.hostname.as_deref(),
            Some("ec2-54-1-2-3.compute-1.amazonaws.com")
        );
        assert_eq!(a.created_at_ms, Some(1_714_566_896_000));

        let b = &page.instances[1];
        assert_eq!(b.state, InstanceState::Stopping);
        assert_eq!(b.addresses.public_ipv4, None);
        assert_eq!(b.addresses.ipv6.as_deref(), Some("2600:1f18::9"));
        assert_eq!(
            b.addresses.hostname.as_deref(),
            Some("ip-10-0-0-13.ec2.internal"),
            "an empty dnsName falls back to the private name"
        );

        let c = &page.instances[2];
        assert_eq!(c.state, InstanceState::Terminated);
        assert!(c.tags.is_empty());
        assert_eq!(c.created_at_ms, None);
        assert_eq!(c.addresses.hostname, None);
    }

    #[test]
    fn last_page_and_empty_answers() {
        let page = describe_instances(
            r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15"><reservationSet/><requestId>x</requestId></DescribeInstancesResponse>"#,
        )
        .expect("parses");
        assert!(page.instances.is_empty());
        assert_eq!(page.next_token, None);
        let page = describe_instances(
            "<DescribeInstancesResponse><reservationSet/><nextToken/></DescribeInstancesResponse>",
        )
        .expect("parses");
        assert_eq!(page.next_token, None, "an empty token ends the list");
    }

    #[test]
    fn refuses_what_is_not_the_answer() {
        for body in ["", "not xml", "<RunInstancesResponse/>", "<a><b></a>"] {
            assert!(describe_instances(body).is_err(), "{body:?}");
        }
        let no_id = "<DescribeInstancesResponse><reservationSet><item><instancesSet><item>\
                     <instanceState><name>running</name></instanceState></item></instancesSet>\
                     </item></reservationSet></DescribeInstancesResponse>";
        assert!(describe_instances(no_id).is_err());
        // A document type definition is refused, so no entity can expand.
        let dtd =
            r#"<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><DescribeInstancesResponse/>"#;
        assert!(describe_instances(dtd).is_err());
    }

    #[test]
    fn reads_run_instances() {
        let body = r#"<RunInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
          <requestId>r</requestId><reservationId>r-1</reservationId><ownerId>1</ownerId><groupSet/>
          <instancesSet><item>
            <instanceId>i-0new</instanceId>
            <instanceState><code>0</code><name>pending</name></instanceState>
            <privateDnsName>ip-10-0-0-5.ec2.internal</privateDnsName><dnsName/>
            <instanceType>c7i.large</instanceType>
            <launchTime>2024-05-01T12:34:56.000Z</launchTime>
            <privateIpAddress>10.0.0.5</privateIpAddress>
            <tagSet><item><key>berth-pool</key><value>p1</value></item></tagSet>
          </item></instancesSet></RunInstancesResponse>"#;
        let i = run_instances(body).expect("parses");
        assert_eq!(i.id, "i-0new");
        assert_eq!(i.state, InstanceState::Pending);
        assert_eq!(i.instance_type, "c7i.large");
        assert_eq!(i.tags, t(&[("berth-pool", "p1")]));
        assert!(
            run_instances("<RunInstancesResponse><instancesSet/></RunInstancesResponse>").is_err()
        );
    }

    #[test]
    fn reads_terminate_instances() {
        let body = r#"<TerminateInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
          <requestId>r</requestId><instancesSet><item><instanceId>i-1</instanceId>
          <currentState><code>32</code><name>shutting-down</name></currentState>
          <previousState><code>16</code><name>running</name></previousState>
          </item></instancesSet></TerminateInstancesResponse>"#;
        assert_eq!(
            terminate_instances(body),
            Ok(vec![StateChange {
                instance_id: "i-1".into(),
                previous: "running".into(),
                current: "shutting-down".into(),
            }])
        );
    }

    #[test]
    fn reads_root_device_and_acks() {
        let body = "<DescribeImagesResponse><imagesSet><item><imageId>ami-1</imageId>\
                    <blockDeviceMapping><item><deviceName>/dev/sdb</deviceName></item></blockDeviceMapping>\
                    <rootDeviceName>/dev/xvda</rootDeviceName></item></imagesSet></DescribeImagesResponse>";
        assert_eq!(root_device_name(body), Ok(Some("/dev/xvda".into())));
        assert_eq!(
            root_device_name("<DescribeImagesResponse><imagesSet/></DescribeImagesResponse>"),
            Ok(None)
        );
        assert!(
            acknowledged(
                "<CreateTagsResponse><return>true</return></CreateTagsResponse>",
                "CreateTags"
            )
            .is_ok()
        );
        assert!(acknowledged("<DeleteTagsResponse/>", "CreateTags").is_err());
    }

    #[test]
    fn reads_error_bodies() {
        // As EC2 writes them (no namespace) and as moto does (with one).
        let ec2 = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
                   <Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-1' does not exist</Message>\
                   </Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>";
        assert_eq!(
            api_error(ec2),
            Some(ApiError {
                code: "InvalidInstanceID.NotFound".into(),
                message: "The instance ID 'i-1' does not exist".into(),
                request_id: Some("ea966190-f9aa-478e-9ede-example".into()),
            })
        );
        let moto = r#"<Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15"><Errors><Error><Code>RequestLimitExceeded</Code><Message>slow down</Message></Error></Errors><RequestID>request-id</RequestID></Response>"#;
        assert_eq!(
            api_error(moto).map(|e| e.code),
            Some("RequestLimitExceeded".into())
        );
        let other = "<ErrorResponse><Error><Code>Throttling</Code></Error><RequestId>x</RequestId></ErrorResponse>";
        assert_eq!(
            api_error(other),
            Some(ApiError {
                code: "Throttling".into(),
                message: String::new(),
                request_id: Some("x".into())
            })
        );
        for body in [
            "",
            "<html>500</html>",
            "<Response><Errors/></Response>",
            "{\"message\": 1}",
        ] {
            assert_eq!(api_error(body), None, "{body:?}");
        }
    }

    #[test]
    fn states() {
        for (name, want) in [
            ("pending", InstanceState::Pending),
            ("running", InstanceState::Running),
            ("shutting-down", InstanceState::Stopping),
            ("stopping", InstanceState::Stopping),
            ("stopped", InstanceState::Stopping),
            ("terminated", InstanceState::Terminated),
            ("exploded", InstanceState::Unknown),
        ] {
            assert_eq!(state(name), want, "{name}");
        }
    }
}
