//! EC2 Query API requests: an action and its parameters as one
//! `application/x-www-form-urlencoded` body, with the numbered list forms
//! (`Tag.1.Key`, `Filter.1.Value.1`, …) the API uses.

use berth_sdk::http::encode_component;

/// The EC2 API version every request names.
pub(crate) const API_VERSION: &str = "2016-11-15";

/// The request's content type. The host signs the body as sent.
pub(crate) const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// One request's body: `Action=…&Version=…&…`, every key and value
/// percent-encoded (RFC 3986 unreserved characters left as they are, the
/// encoding SigV4 signs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Query {
    action: &'static str,
    body: String,
}

impl Query {
    pub fn new(action: &'static str) -> Query {
        Query {
            action,
            body: format!("Action={action}&Version={API_VERSION}"),
        }
    }

    pub fn action(&self) -> &'static str {
        self.action
    }

    pub fn body(&self) -> &str {
        &self.body
    }

    /// Adds `key=value`.
    pub fn param(&mut self, key: &str, value: &str) -> &mut Query {
        self.body.push('&');
        self.body.push_str(&encode_component(key));
        self.body.push('=');
        self.body.push_str(&encode_component(value));
        self
    }

    /// Adds `PREFIX.1=v1&PREFIX.2=v2…`.
    pub fn list<'a>(
        &mut self,
        prefix: &str,
        values: impl IntoIterator<Item = &'a str>,
    ) -> &mut Query {
        for (i, value) in values.into_iter().enumerate() {
            self.param(&format!("{prefix}.{}", i + 1), value);
        }
        self
    }

    /// Adds `PREFIX.N.Key` and `PREFIX.N.Value` for each tag.
    pub fn tags(&mut self, prefix: &str, tags: &[(String, String)]) -> &mut Query {
        for (i, (k, v)) in tags.iter().enumerate() {
            self.param(&format!("{prefix}.{}.Key", i + 1), k);
            self.param(&format!("{prefix}.{}.Value", i + 1), v);
        }
        self
    }

    /// Adds one `Filter.N` per tag key: `Name=tag:KEY`, one value.
    ///
    /// EC2 reads `*` and `?` in filter values as wildcards and `\` as their
    /// escape. Each of the three is sent as `?` (any one character), so the
    /// cloud's answer is a superset of the exact match on any server,
    /// whatever its escaping rules; the caller filters it exactly. A key
    /// given twice keeps its first value here for the same reason.
    pub fn tag_filters(&mut self, filter: &[(String, String)]) -> &mut Query {
        let mut seen: Vec<&str> = Vec::new();
        for (k, v) in filter {
            if seen.contains(&k.as_str()) {
                continue;
            }
            seen.push(k);
            let n = seen.len();
            self.param(&format!("Filter.{n}.Name"), &format!("tag:{k}"));
            self.param(&format!("Filter.{n}.Value.1"), &filter_value(v));
        }
        self
    }
}

/// A tag value as a filter value that matches at least that value.
fn filter_value(value: &str) -> String {
    value.replace(['*', '?', '\\'], "?")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn builds_bodies() {
        let mut q = Query::new("RunInstances");
        q.param("ImageId", "ami-1")
            .list("SecurityGroupId", ["sg-1", "sg-2"])
            .tags(
                "TagSpecification.1.Tag",
                &t(&[("berth-pool", "p 1"), ("k&=", "v/é")]),
            );
        assert_eq!(q.action(), "RunInstances");
        assert_eq!(
            q.body(),
            "Action=RunInstances&Version=2016-11-15&ImageId=ami-1\
             &SecurityGroupId.1=sg-1&SecurityGroupId.2=sg-2\
             &TagSpecification.1.Tag.1.Key=berth-pool&TagSpecification.1.Tag.1.Value=p%201\
             &TagSpecification.1.Tag.2.Key=k%26%3D&TagSpecification.1.Tag.2.Value=v%2F%C3%A9"
        );
    }

    #[test]
    fn tag_filters_widen_wildcards_and_skip_repeated_keys() {
        let mut q = Query::new("DescribeInstances");
        q.tag_filters(&t(&[
            ("berth-pool", "p*1?\\"),
            ("berth-node", "n-1"),
            ("berth-pool", "other"),
        ]));
        assert_eq!(
            q.body(),
            "Action=DescribeInstances&Version=2016-11-15\
             &Filter.1.Name=tag%3Aberth-pool&Filter.1.Value.1=p%3F1%3F%3F\
             &Filter.2.Name=tag%3Aberth-node&Filter.2.Value.1=n-1"
        );
    }
}
