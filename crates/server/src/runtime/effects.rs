//! The effects the core asks for, carried out on tasks of their own:
//! driver calls (checked before the pool sees their answer) and readiness
//! probes, whose outcomes come back to the pool's task.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::sync::Arc;

use tokio::sync::mpsc;

use berth_config::ProviderIx;
use berth_core::driver::check::{self, BadAnswer};
use berth_core::driver::{Instance, POOL_TAG, Page, Tags};
use berth_core::pool::{DriverCall, Failure, HostFailureKind, NodeId, Probe, ToDelete};
use berth_plugin::{CallError, CallErrorKind};

use super::observer::{InFlight, Observer};
use super::providers::{Cloud, Many, Providers};
use super::shards::Shards;

/// What came back from outside the pool's task.
#[expect(
    clippy::large_enum_variant,
    reason = "an outcome moves once through a channel; boxing it would add an allocation per call"
)]
pub(super) enum Outcome {
    /// A driver call ended. As many as there are calls in flight, which the
    /// core bounds.
    Called(Called),
    /// A readiness probe ended (not a driver call: not counted in flight).
    Probed(NodeId, Result<Vec<String>, String>),
}

/// What a driver call brought back.
pub(super) enum Called {
    Created(NodeId, Result<Instance, Failure>),
    CreatedMany(ProviderIx, Vec<(NodeId, Result<Instance, Failure>)>),
    Deleted(ProviderIx, Option<NodeId>, String, Result<(), Failure>),
    DeletedMany(ProviderIx, Vec<(ToDelete, Result<(), Failure>)>),
    Listed(ProviderIx, Result<Page, Failure>),
    /// The ids asked, and what the driver answered.
    Got(ProviderIx, Vec<String>, Result<Vec<Instance>, Failure>),
    Tagged(NodeId, Result<(), Failure>),
}

pub(super) fn failure(e: CallError) -> Failure {
    let kind = match e.kind {
        CallErrorKind::Driver(d) => return Failure::Driver(d),
        CallErrorKind::PeerLost(_) => return Failure::Unknown(e.to_string()),
        CallErrorKind::Trap(_) | CallErrorKind::Start(_) => HostFailureKind::Trap,
        CallErrorKind::NotStarted(_) | CallErrorKind::Stopped => HostFailureKind::NotStarted,
        CallErrorKind::Peer(_) => HostFailureKind::Peer,
    };
    Failure::host(kind, e.to_string())
}

/// Makes one readiness probe on its own task; the outcome comes back as an
/// event. Not a driver call: the stop does not wait for it, and a pool that
/// stood by meanwhile never hears it.
pub(super) fn probe(
    probe: Probe,
    providers: &Arc<Providers>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    observer: Arc<dyn Observer>,
) {
    let Probe {
        provider,
        node,
        instance,
        target,
    } = probe;
    let providers = providers.clone();
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let r = providers.prober().probe(provider, &target).await;
        let name = providers.name(provider);
        let check = target.check;
        observer.probed(
            &name,
            check,
            r.as_ref().map(|_| ()).map_err(String::as_str),
            started.elapsed(),
        );
        if let Err(why) = &r {
            tracing::debug!(provider = name, %node, %instance, check = check.as_str(), error = %why, "not ready yet");
        }
        let _ = outcomes.send(Outcome::Probed(node, r));
    });
}

/// Carries out one driver call on its own task; the outcome comes back as
/// an event.
pub(super) fn call(
    call: DriverCall,
    providers: &Arc<Providers>,
    route: Option<(Arc<Shards>, i64)>,
    pool_id: &str,
    outcomes: mpsc::UnboundedSender<Outcome>,
    observer: Arc<dyn Observer>,
) {
    let p = call.provider();
    let providers = providers.clone();
    let name: Arc<str> = providers_name(&providers, p);
    let pool_id = pool_id.to_owned();
    // Counted from now, on the pool's task: once the pool has stopped
    // deciding, every call it committed is counted until it ends.
    let in_flight = InFlight::new(observer.clone(), name.clone());
    tokio::spawn(async move {
        let _in_flight = in_flight;
        let started = tokio::time::Instant::now();
        let what = call.name();
        let heard = |r: Result<(), &CallError>| {
            observer.call(&name, what, r, started.elapsed());
        };
        // A provider still starting is waited for; one whose start failed
        // fails the call at once, and the core treats it as any failed call.
        // With the providers shared out, the call goes to the provider's
        // holder (this process or another).
        let provider = match route {
            Some((shards, epoch)) => Ok(shards.cloud(p, providers.clone(), epoch)),
            None => providers.get(p).await,
        };
        let called = match provider {
            Ok(provider) => make(call, &*provider, &name, &pool_id, &observer, heard).await,
            Err(why) => {
                let e = CallError {
                    provider: name.clone(),
                    call: what,
                    kind: CallErrorKind::NotStarted(why),
                };
                heard(Err(&e));
                let failed = failure(e);
                match call {
                    DriverCall::Create { node, .. } => Called::Created(node, Err(failed)),
                    DriverCall::Delete { node, instance, .. } => {
                        Called::Deleted(p, node, instance, Err(failed))
                    }
                    DriverCall::List { .. } => Called::Listed(p, Err(failed)),
                    DriverCall::Get { instances, .. } => Called::Got(p, instances, Err(failed)),
                    DriverCall::SetTags { node, .. } => Called::Tagged(node, Err(failed)),
                    DriverCall::CreateMany { creates, .. } => Called::CreatedMany(
                        p,
                        (creates.into_iter())
                            .map(|(n, _)| (n, Err(failed.clone())))
                            .collect(),
                    ),
                    DriverCall::DeleteMany { deletes, .. } => Called::DeletedMany(
                        p,
                        (deletes.into_iter())
                            .map(|d| (d, Err(failed.clone())))
                            .collect(),
                    ),
                }
            }
        };
        // The pool may have stopped; its stored intents cover the outcome.
        let _ = outcomes.send(Outcome::Called(called));
    });
}

/// Makes `call` on `provider`'s driver, and checks what it answers before
/// the pool sees it.
pub(super) async fn make(
    call: DriverCall,
    provider: &dyn Cloud,
    name: &str,
    pool_id: &str,
    observer: &Arc<dyn Observer>,
    heard: impl Fn(Result<(), &CallError>),
) -> Called {
    let refused = |r: &[BadAnswer]| {
        if !r.is_empty() {
            tracing::warn!(
                provider = %name,
                count = r.len(),
                first = %r[0],
                "refused what the driver answered: the pool acts as if it had not been said"
            );
            observer.refused(name, r);
        }
    };
    // A list's or a get's instances, checked one by one and for ids named
    // twice.
    let listing = |all| {
        let (kept, bad) = check::listing(all);
        refused(&bad);
        kept
    };
    // A created instance, checked before the pool believes it.
    let created = |inst: Instance| match check::instance(&inst) {
        Ok(()) => Ok(inst),
        Err(bad) => {
            refused(std::slice::from_ref(&bad));
            Err(Failure::host(
                HostFailureKind::BadAnswer,
                format!("the driver answered {bad}"),
            ))
        }
    };
    match call {
        DriverCall::Create { node, spec, .. } => {
            let r = provider.create(spec).await;
            heard(r.as_ref().map(|_| ()));
            Called::Created(node, r.map_err(failure).and_then(created))
        }
        DriverCall::CreateMany {
            provider: p,
            creates,
        } => {
            let (nodes, specs): (Vec<NodeId>, Vec<_>) = creates.into_iter().unzip();
            let r = provider.create_many(specs).await;
            heard(r.as_ref().map(|_| ()));
            let answers = per_item(r, nodes.len(), created);
            Called::CreatedMany(p, nodes.into_iter().zip(answers).collect())
        }
        DriverCall::DeleteMany {
            provider: p,
            deletes,
        } => {
            let ids = deletes.iter().map(|d| d.instance.clone()).collect();
            let r = provider.delete_many(ids).await;
            heard(r.as_ref().map(|_| ()));
            let answers = per_item(r, deletes.len(), |_| Ok(()));
            Called::DeletedMany(p, deletes.into_iter().zip(answers).collect())
        }
        DriverCall::Delete {
            provider: p,
            node,
            instance,
        } => {
            let r = provider.delete(&instance).await;
            heard(r.as_ref().map(|_| ()));
            Called::Deleted(p, node, instance, r.map(|_| ()).map_err(failure))
        }
        DriverCall::List {
            provider: p,
            cursor,
        } => {
            let filter: Tags = [(POOL_TAG.to_owned(), pool_id.to_owned())].into();
            let r = provider.list_page(filter, cursor).await;
            heard(r.as_ref().map(|_| ()));
            let page = |page: Page| Page {
                instances: listing(page.instances),
                next: page.next,
            };
            Called::Listed(p, r.map_err(failure).map(page))
        }
        DriverCall::Get {
            provider: p,
            instances,
        } => {
            let r = provider.get(instances.clone()).await;
            heard(r.as_ref().map(|_| ()));
            Called::Got(p, instances, r.map_err(failure).map(listing))
        }
        DriverCall::SetTags {
            node,
            instance,
            tags,
            ..
        } => {
            let r = provider.set_tags(&instance, tags).await;
            heard(r.as_ref().map(|_| ()));
            Called::Tagged(node, r.map_err(failure))
        }
    }
}

/// A batch's answer as one outcome per item, each item's success passed
/// through `ok`. A call that failed as a whole gives each item its failure;
/// one answered with another number of results than `asked` items is
/// believed for none of them, since which answer is whose cannot be told:
/// each item fails as an answer berth refused, which for a create means it
/// may have been made (the pool waits for a list to tell).
fn per_item<T, U>(
    answer: Many<T>,
    asked: usize,
    ok: impl Fn(T) -> Result<U, Failure>,
) -> Vec<Result<U, Failure>> {
    let whole = match answer {
        Ok(all) if all.len() == asked => {
            let each = all.into_iter().map(|a| a.map_err(Failure::Driver));
            return each.map(|a| a.and_then(&ok)).collect();
        }
        Ok(all) => Failure::host(
            HostFailureKind::BadAnswer,
            format!("the batch answered {} results to {asked} items", all.len()),
        ),
        Err(e) => failure(e),
    };
    (0..asked).map(|_| Err(whole.clone())).collect()
}

pub(super) fn providers_name(providers: &Providers, p: ProviderIx) -> Arc<str> {
    providers.name(p).into()
}
