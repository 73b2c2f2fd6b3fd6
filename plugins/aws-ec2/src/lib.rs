//! The berth driver for AWS EC2, over the EC2 Query API.
//!
//! Every call is one or a few form-encoded `POST`s to the region's endpoint.
//! The driver holds no credentials and signs nothing: the host signs each
//! allowed request with AWS SigV4 for the provider. Instances carry berth's
//! tags from the moment `RunInstances` makes them (`TagSpecifications`), and
//! berth's create token is the launch's `ClientToken`, so a retried create
//! never makes two. The driver touches only instances tagged with its pool
//! id: a batch of deletes is looked up with that tag first, in one
//! `DescribeInstances` for the batch, and so is an instance before
//! `set-tags`.

#![forbid(unsafe_code)]

mod config;
mod errors;
mod query;
mod userdata;
mod xml;

use std::collections::HashMap;

use berth_sdk::http::Request;
use berth_sdk::tags::{self, POOL_TAG};
use berth_sdk::types::{
    AccountLimits, Capabilities, CreateSpec, DriverInfo, Error, Instance, InstanceState, Page,
};
use berth_sdk::{Driver, error, pages};

use config::{Config, LabelOptions, Market};
use query::{CONTENT_TYPE, Query};

/// `ClientToken` takes at most 64 ASCII characters.
const MAX_CLIENT_TOKEN: usize = 64;

/// The configured driver.
struct Ec2 {
    pool_id: String,
    config: Config,
    /// Image id → its root device name, learnt from `DescribeImages`. Only
    /// saves calls: another instance of the driver asks again.
    root_devices: HashMap<String, String>,
}

impl Ec2 {
    /// Sends one request; a non-2xx answer becomes the contract's error.
    /// `instance_type` names what a create asked for, for capacity errors.
    fn call(&self, query: &Query, instance_type: Option<&str>) -> Result<String, Error> {
        let resp = Request::post(&self.config.endpoint)
            .header("content-type", CONTENT_TYPE)
            .body(query.body().as_bytes().to_vec())
            .send()?;
        if resp.is_success() {
            Ok(resp.text())
        } else {
            Err(errors::from_response(&resp, instance_type))
        }
    }

    /// The pool tag filter plus `filter`, with this pool's id.
    fn pool_filter(&self, filter: &[(String, String)]) -> Vec<(String, String)> {
        tags::with_pool(filter, &self.pool_id)
    }

    /// The instance `id` if it carries this pool's tag; `None` if it exists
    /// but does not. EC2 answers `InvalidInstanceID.NotFound` (not-found)
    /// for an id it does not know.
    fn describe_owned(&self, id: &str) -> Result<Option<Instance>, Error> {
        Ok(self.describe_ids(&[id.to_owned()])?.pop())
    }

    /// The instances among `ids` that carry this pool's tag, in one
    /// `DescribeInstances`: by the `instance-id` filter, which (unlike
    /// `InstanceId.N`) is no error for an id that does not exist. At most
    /// 1000 ids, one page's worth.
    fn describe_ids(&self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let mut q = Query::new("DescribeInstances");
        // Filter.1 is the pool's tag.
        q.tag_filters(&self.pool_filter(&[]))
            .param("Filter.2.Name", "instance-id")
            .list("Filter.2.Value", ids.iter().map(String::as_str))
            .param("MaxResults", "1000");
        let body = self.call(&q, None)?;
        let page = xml::describe_instances(&body).map_err(error::transient)?;
        Ok(pages::only_ids(page.instances, ids, &self.pool_id))
    }

    /// The root device name of `image`, for a block device mapping.
    fn root_device(&mut self, image: &str) -> Result<String, Error> {
        if let Some(name) = self.root_devices.get(image) {
            return Ok(name.clone());
        }
        let mut q = Query::new("DescribeImages");
        q.param("ImageId.1", image);
        let body = self.call(&q, None)?;
        match xml::root_device_name(&body).map_err(error::transient)? {
            Some(name) => {
                self.root_devices.insert(image.to_owned(), name.clone());
                Ok(name)
            }
            None => Err(error::invalid_config(format!(
                "image {image:?}: DescribeImages does not know it; root-volume-size and \
                 root-volume-type need its root device (or set root-device-name)"
            ))),
        }
    }

    /// The `RunInstances` request for `spec`.
    fn run_query(
        &mut self,
        spec: &CreateSpec,
        options: &LabelOptions,
        tags: &[(String, String)],
    ) -> Result<Query, Error> {
        let mut q = Query::new("RunInstances");
        q.param("ImageId", &spec.image)
            .param("InstanceType", &spec.instance_type)
            .param("MinCount", "1")
            .param("MaxCount", "1")
            .param("ClientToken", &spec.token)
            // A machine that shuts itself down is gone, not a stopped
            // volume that bills on.
            .param("InstanceInitiatedShutdownBehavior", "terminate")
            .param("TagSpecification.1.ResourceType", "instance")
            .tags("TagSpecification.1.Tag", tags);
        if let Some(subnet) = &options.subnet_id {
            q.param("SubnetId", subnet);
        }
        q.list(
            "SecurityGroupId",
            options.security_group_ids.iter().map(String::as_str),
        );
        if let Some(key) = &options.key_name {
            q.param("KeyName", key);
        }
        if let Some(profile) = &options.instance_profile {
            let field = if profile.starts_with("arn:") {
                "IamInstanceProfile.Arn"
            } else {
                "IamInstanceProfile.Name"
            };
            q.param(field, profile);
        }
        if options.sets_root_volume() {
            let device = match &options.root_device_name {
                Some(name) => name.clone(),
                None => self.root_device(&spec.image)?,
            };
            q.param("BlockDeviceMapping.1.DeviceName", &device)
                .param("BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true");
            if let Some(size) = options.root_volume_size {
                q.param("BlockDeviceMapping.1.Ebs.VolumeSize", &size.to_string());
            }
            if let Some(kind) = &options.root_volume_type {
                q.param("BlockDeviceMapping.1.Ebs.VolumeType", kind);
            }
        }
        if options.market == Market::Spot {
            q.param("InstanceMarketOptions.MarketType", "spot")
                .param(
                    "InstanceMarketOptions.SpotOptions.SpotInstanceType",
                    "one-time",
                )
                .param(
                    "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
                    "terminate",
                );
        }
        let user_data =
            userdata::compose(spec.user_data.as_deref(), spec.ssh_public_key.as_deref())
                .map_err(error::permanent)?;
        if let Some(text) = user_data {
            q.param("UserData", &userdata::base64(text.as_bytes()));
        }
        Ok(q)
    }
}

impl Driver for Ec2 {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "aws-ec2".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Instances on AWS EC2, over the EC2 Query API. The host signs every \
                          request with the provider's AWS credentials (SigV4); the driver holds \
                          none. Instances are tagged at launch and berth's create token is the \
                          launch's client token. The image is an AMI id, the instance type an EC2 \
                          instance type."
                .into(),
            config: config::config_fields(),
            label_options: config::label_option_fields(),
            capabilities: Capabilities::IDEMPOTENT_CREATE
                | Capabilities::USER_DATA
                | Capabilities::SSH_KEYS
                | Capabilities::DELETE_MANY,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let mut config = config::parse_config(config);
        if pool_id.is_empty() {
            let problem = "pool id: must not be empty".to_owned();
            config = Err(match config {
                Ok(_) => problem,
                Err(m) => format!("{m}; {problem}"),
            });
        }
        Ok(Ec2 {
            pool_id: pool_id.to_owned(),
            config: config.map_err(error::invalid_config)?,
            root_devices: HashMap::new(),
        })
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        let options = config::parse_label_options(&spec.options).map_err(error::invalid_config)?;
        if spec.image.trim().is_empty() {
            return Err(error::invalid_config("image: must name an AMI (ami-…)"));
        }
        if spec.instance_type.trim().is_empty() {
            return Err(error::invalid_config("instance type: must not be empty"));
        }
        if spec.token.is_empty()
            || spec.token.len() > MAX_CLIENT_TOKEN
            || !spec.token.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(error::permanent(format!(
                "create token {:?} cannot be a ClientToken (1 to {MAX_CLIENT_TOKEN} printable \
                 ASCII characters)",
                spec.token
            )));
        }
        // The pool tag is this pool's, whatever the spec says.
        let launch_tags = tags::with_pool(&spec.tags, &self.pool_id);

        let q = self.run_query(&spec, &options, &launch_tags)?;
        let body = self.call(&q, Some(&spec.instance_type))?;
        let mut instance = xml::run_instances(&body).map_err(error::transient)?;
        // The tags were applied with the launch; an answer that leaves some
        // out (older API behaviour) still describes an instance carrying them.
        for (k, v) in launch_tags {
            if tags::tag(&instance.tags, &k).is_none() {
                instance.tags.push((k, v));
            }
        }
        Ok(instance)
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        self.describe_ids(ids)
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        // A filter naming another pool matches nothing this driver may see.
        if tags::names_other_pool(filter, &self.pool_id) {
            return Ok(Page {
                instances: vec![],
                next: None,
            });
        }
        let wanted = self.pool_filter(filter);
        let mut q = Query::new("DescribeInstances");
        q.tag_filters(&wanted)
            .param("MaxResults", &self.config.page_size.to_string());
        if let Some(token) = cursor {
            q.param("NextToken", token);
        }
        let body = self.call(&q, None)?;
        let page = xml::describe_instances(&body).map_err(error::transient)?;
        // A token that does not move would have the host loop.
        if page.next_token.is_some() && page.next_token.as_deref() == cursor {
            return Err(error::transient(format!(
                "DescribeInstances repeated its page token {cursor:?}"
            )));
        }
        // The filters sent are a superset of the exact match (see
        // `Query::tag_filters`); keep exactly the instances carrying every
        // wanted tag, each once.
        let mut instances = page.instances;
        let mut seen = std::collections::HashSet::new();
        instances.retain(|i| tags::has_all(&i.tags, &wanted) && seen.insert(i.id.clone()));
        Ok(Page {
            instances,
            next: page.next_token,
        })
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        let mut answers = self.delete_many(&[instance_id.to_owned()]);
        answers
            .pop()
            .unwrap_or_else(|| Err(error::transient("no answer for the delete")))
    }

    /// One `DescribeInstances` for the batch, to leave alone what does not
    /// carry this pool's tag, then one `TerminateInstances` for the rest.
    fn delete_many(&mut self, instance_ids: &[String]) -> Vec<Result<(), Error>> {
        let all_fail = |e: Error| instance_ids.iter().map(|_| Err(e.clone())).collect();
        let owned = match self.describe_ids(instance_ids) {
            Ok(owned) => owned,
            Err(e) => return all_fail(e),
        };
        let state_of = |id: &str| owned.iter().find(|i| i.id == id).map(|i| i.state.clone());
        let to_end: Vec<&str> = instance_ids
            .iter()
            .map(String::as_str)
            .filter(|id| matches!(state_of(id), Some(s) if s != InstanceState::Terminated))
            .collect();
        let changes = if to_end.is_empty() {
            Vec::new()
        } else {
            let mut q = Query::new("TerminateInstances");
            q.list("InstanceId", to_end.iter().copied());
            let ended = self
                .call(&q, None)
                .and_then(|body| xml::terminate_instances(&body).map_err(error::transient));
            match ended {
                Ok(changes) => changes,
                Err(e) => return all_fail(e),
            }
        };
        instance_ids
            .iter()
            .map(|id| match state_of(id) {
                None => Err(error::not_found(format!(
                    "{id} does not carry {POOL_TAG}={}; left alone",
                    self.pool_id
                ))),
                Some(InstanceState::Terminated) => {
                    Err(error::not_found(format!("{id} is already terminated")))
                }
                Some(_) => match changes.iter().find(|c| c.instance_id == *id) {
                    Some(c) if c.previous == "terminated" => {
                        Err(error::not_found(format!("{id} is already terminated")))
                    }
                    Some(_) => Ok(()),
                    None => Err(error::transient(format!(
                        "TerminateInstances did not report {id}"
                    ))),
                },
            })
            .collect()
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        if tags::names_other_pool(new, &self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move an instance to another pool",
            ));
        }
        let Some(instance) = self.describe_owned(instance_id)? else {
            return Err(error::not_found(format!(
                "{instance_id} does not carry {POOL_TAG}={}; left alone",
                self.pool_id
            )));
        };
        // The pool tag always stays, whatever `new` says.
        let wanted = self.pool_filter(new);
        let result = tags::replace_berth_tags(&instance.tags, &wanted);
        let to_set: Vec<(String, String)> = result
            .iter()
            .filter(|(k, v)| tags::tag(&instance.tags, k) != Some(v.as_str()))
            .cloned()
            .collect();
        let to_delete: Vec<&str> = instance
            .tags
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| tags::tag(&result, k).is_none())
            .collect();
        // Add before removing: a failure between the two leaves a superset,
        // which the next set-tags repairs, never an instance without its tags.
        if !to_set.is_empty() {
            let mut q = Query::new("CreateTags");
            q.param("ResourceId.1", instance_id).tags("Tag", &to_set);
            let body = self.call(&q, None)?;
            xml::acknowledged(&body, q.action()).map_err(error::transient)?;
        }
        if !to_delete.is_empty() {
            let mut q = Query::new("DeleteTags");
            q.param("ResourceId.1", instance_id);
            for (i, key) in to_delete.iter().enumerate() {
                q.param(&format!("Tag.{}.Key", i + 1), key);
            }
            let body = self.call(&q, None)?;
            xml::acknowledged(&body, q.action()).map_err(error::transient)?;
        }
        Ok(())
    }

    /// EC2's own instance limits are vCPU quotas kept by the Service Quotas
    /// API, another service on another host, and the account's usage would
    /// take a full DescribeInstances of the account. So the driver does not
    /// declare `account-limits` (the host never calls this) and answers an
    /// empty record: every value unknown.
    fn limits(&mut self) -> Result<AccountLimits, Error> {
        Ok(AccountLimits {
            max_instances: None,
            max_cores: None,
            max_ram_mib: None,
            used_instances: None,
            used_cores: None,
            used_ram_mib: None,
        })
    }
}

berth_sdk::export_driver!(Ec2);

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn driver() -> Ec2 {
        Ec2::configure(
            "p1",
            r#"{"region": "us-east-1", "endpoint": "http://127.0.0.1:5000"}"#,
        )
        .unwrap_or_else(|e| panic!("configure: {e:?}"))
    }

    fn spec(options: &str) -> CreateSpec {
        CreateSpec {
            node_id: "n-00000000000000ab".into(),
            token: "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7".into(),
            instance_type: "t3.micro".into(),
            image: "ami-0abc".into(),
            tags: t(&[("berth-pool", "p1"), ("berth-node", "n-00000000000000ab")]),
            user_data: None,
            ssh_public_key: None,
            options: options.into(),
        }
    }

    #[test]
    fn describe_declares_what_it_does() {
        let info = Ec2::describe();
        assert_eq!(info.name, "aws-ec2");
        let names: Vec<&str> = info.config.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["region", "endpoint", "page-size"]);
        assert!(info.config.iter().any(|f| f.name == "region" && f.required));
        let options: Vec<&str> = info.label_options.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            options,
            [
                "subnet-id",
                "security-group-ids",
                "key-name",
                "root-volume-size",
                "root-volume-type",
                "root-device-name",
                "market",
                "instance-profile"
            ]
        );
        for field in info.config.iter().chain(&info.label_options) {
            if let Some(default) = &field.default {
                assert!(
                    serde_json::from_str::<serde_json::Value>(default).is_ok(),
                    "{}",
                    field.name
                );
            }
        }
        assert!(info.capabilities.contains(Capabilities::IDEMPOTENT_CREATE));
        assert!(
            info.capabilities
                .contains(Capabilities::USER_DATA | Capabilities::SSH_KEYS)
        );
        assert!(!info.capabilities.contains(Capabilities::ACCOUNT_LIMITS));
    }

    #[test]
    fn configure_refuses_bad_config_and_empty_pool() {
        assert!(matches!(
            Ec2::configure("", r#"{"region": "us-east-1"}"#),
            Err(Error::InvalidConfig(m)) if m.contains("pool id")
        ));
        assert!(matches!(
            Ec2::configure("p", r#"{"endpoint": "http://h"}"#),
            Err(Error::InvalidConfig(m)) if m.contains("region: missing")
        ));
    }

    #[test]
    fn run_query_carries_every_option() {
        let mut d = driver();
        let mut s = spec(
            r#"{"subnet-id": "subnet-1", "security-group-ids": ["sg-1", "sg-2"], "key-name": "ops",
                "root-volume-size": 40, "root-volume-type": "gp3", "root-device-name": "/dev/xvda",
                "market": "spot", "instance-profile": "arn:aws:iam::1:instance-profile/runner"}"#,
        );
        s.user_data = Some("#!/bin/sh\n".into());
        let options = config::parse_label_options(&s.options).expect("valid");
        let q = d.run_query(&s, &options, &s.tags.clone()).expect("builds");
        let params: Vec<&str> = q.body().split('&').collect();
        for want in [
            "Action=RunInstances",
            "ImageId=ami-0abc",
            "InstanceType=t3.micro",
            "MinCount=1",
            "MaxCount=1",
            "ClientToken=3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7",
            "InstanceInitiatedShutdownBehavior=terminate",
            "TagSpecification.1.ResourceType=instance",
            "TagSpecification.1.Tag.1.Key=berth-pool",
            "TagSpecification.1.Tag.1.Value=p1",
            "TagSpecification.1.Tag.2.Key=berth-node",
            "SubnetId=subnet-1",
            "SecurityGroupId.1=sg-1",
            "SecurityGroupId.2=sg-2",
            "KeyName=ops",
            "IamInstanceProfile.Arn=arn%3Aaws%3Aiam%3A%3A1%3Ainstance-profile%2Frunner",
            "BlockDeviceMapping.1.DeviceName=%2Fdev%2Fxvda",
            "BlockDeviceMapping.1.Ebs.VolumeSize=40",
            "BlockDeviceMapping.1.Ebs.VolumeType=gp3",
            "BlockDeviceMapping.1.Ebs.DeleteOnTermination=true",
            "InstanceMarketOptions.MarketType=spot",
            "InstanceMarketOptions.SpotOptions.SpotInstanceType=one-time",
            "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior=terminate",
            "UserData=IyEvYmluL3NoCg%3D%3D",
        ] {
            assert!(params.contains(&want), "{want} missing from {}", q.body());
        }
    }

    #[test]
    fn run_query_leaves_out_what_is_not_asked() {
        let mut d = driver();
        let s = spec("{}");
        let q = d
            .run_query(&s, &LabelOptions::default(), &s.tags)
            .expect("builds");
        for absent in [
            "SubnetId",
            "SecurityGroupId",
            "KeyName",
            "IamInstanceProfile",
            "BlockDeviceMapping",
            "InstanceMarketOptions",
            "UserData",
        ] {
            assert!(!q.body().contains(absent), "{absent} in {}", q.body());
        }
        let options =
            config::parse_label_options(r#"{"instance-profile": "runner"}"#).expect("valid");
        let q = d.run_query(&s, &options, &s.tags).expect("builds");
        assert!(q.body().contains("&IamInstanceProfile.Name=runner"));
    }

    #[test]
    fn create_refuses_bad_options_before_any_request() {
        let mut d = driver();
        for (options, needle) in [
            (r#"{"zone": "a"}"#, "zone"),
            (r#"{"market": "cheap"}"#, "market"),
            ("[]", "JSON object"),
        ] {
            match d.create(spec(options)) {
                Err(Error::InvalidConfig(m)) => assert!(m.contains(needle), "{options}: {m}"),
                other => panic!("{options}: {other:?}"),
            }
        }
        let mut s = spec("{}");
        s.image = String::new();
        assert!(matches!(d.create(s), Err(Error::InvalidConfig(m)) if m.contains("image")));
        let mut s = spec("{}");
        s.token = "n".repeat(65);
        assert!(matches!(d.create(s), Err(Error::Permanent(m)) if m.contains("ClientToken")));
    }

    #[test]
    fn foreign_pool_lists_nothing_without_a_request() {
        let mut d = driver();
        assert!(matches!(
            d.list(&t(&[("berth-pool", "other")]), None),
            Ok(p) if p.instances.is_empty() && p.next.is_none()
        ));
        assert!(matches!(
            d.set_tags("i-1", &t(&[("berth-pool", "other")])),
            Err(Error::Permanent(_))
        ));
    }
}
