//! The core's notices, handed to the observer and said in the log (leak
//! deletes and refused adoptions summed up per step).

use std::collections::HashMap;

use berth_config::ProviderIx;
use berth_core::pool::Notice;

use super::task::Loop;

impl Loop {
    /// Hands the step's notices to the observer and says them in the log.
    pub(super) fn say_notices(&mut self) {
        // Leak deletes and refused adoptions can come by the thousand (a
        // driver that lists thousands of orphans): one line per provider and
        // kind per step, with a count.
        let mut summed: HashMap<(ProviderIx, &'static str), (usize, String)> = HashMap::new();
        for notice in self.pool.take_notices() {
            self.observer.notice(self.pool.config(), &notice);
            match notice {
                Notice::LeakDeleted { provider, instance } => {
                    let e = summed.entry((provider, "leak")).or_insert((0, instance));
                    e.0 += 1;
                }
                Notice::NotAdopted { provider, instance } => {
                    let e = summed.entry((provider, "over")).or_insert((0, instance));
                    e.0 += 1;
                }
                notice => self.log(notice),
            }
        }
        for ((provider, kind), (count, first)) in summed {
            let provider = self.pool.config()[provider].name.as_str();
            match kind {
                "leak" => tracing::warn!(
                    provider,
                    count,
                    first = %first,
                    "deleted leaked instances (owned by this pool, no node accounts for them)"
                ),
                _ => tracing::warn!(
                    provider,
                    count,
                    first = %first,
                    "instances with this pool's tags not adopted: the provider's limits are full; each is deleted as a leak after leak-grace if it is still there"
                ),
            }
        }
    }

    pub(super) fn log(&self, notice: Notice) {
        let config = self.pool.config();
        let pname = |p: ProviderIx| config[p].name.as_str();
        match notice {
            Notice::Foreign { provider, count } => tracing::info!(
                provider = pname(provider),
                count,
                "instances without this pool's id are listed; berth leaves them alone"
            ),
            Notice::ListRefused { provider, refused } => tracing::warn!(
                provider = pname(provider),
                count = refused.len(),
                first = %refused.first().map(ToString::to_string).unwrap_or_default(),
                "refused what the driver's list answered over its pages: the pool acts as if it had not been said"
            ),
            Notice::LeakDeleted { .. } | Notice::NotAdopted { .. } => {}
            Notice::Adopted { node, instance } => {
                tracing::info!(%node, %instance, "adopted an instance from its tags")
            }
            Notice::Vanished { node } => {
                tracing::warn!(%node, "the node's instance is gone (confirmed missing, or listed as terminated); the node is given up")
            }
            Notice::Missing { node, instance } => tracing::warn!(
                %node,
                %instance,
                "a list did not show the node's instance: suspected missing, not gone; nothing changes unless later lists confirm it"
            ),
            Notice::Reappeared { node } => {
                tracing::info!(%node, "the node's instance is listed again; no longer suspected")
            }
            Notice::LostInUse { node } => tracing::warn!(
                %node,
                "the node's instance is gone while the node is in use: it stays with its holder and is deleted once released"
            ),
            Notice::Revived { node, instance } => tracing::warn!(
                %node,
                %instance,
                "an instance given up as vanished is listed again: its node is back"
            ),
            Notice::ListFailing {
                provider,
                failures,
                error,
            } => tracing::warn!(
                provider = pname(provider),
                failures,
                %error,
                "listing the provider fails; nothing is decided on its answers until one works (said again at most once a minute)"
            ),
            Notice::ListSuspect { provider, known } => tracing::warn!(
                provider = pname(provider),
                known,
                "the provider's list shows none of the instances berth holds there; it is not believed (said again at most once a minute)"
            ),
            Notice::ListRecovered { provider, since } => tracing::info!(
                provider = pname(provider),
                since_ms = since.as_millis(),
                "the provider's lists are believed again"
            ),
            Notice::RequestFailed { request, reason } => {
                tracing::warn!(%request, %reason, "request failed")
            }
            Notice::QuotaPaused { provider, until } => tracing::warn!(
                provider = pname(provider),
                until = %berth_core::duration::rfc3339(until.as_millis()),
                "quota exceeded; creates paused"
            ),
            Notice::RateLimited { provider, until } => tracing::warn!(
                provider = pname(provider),
                until = %berth_core::duration::rfc3339(until.as_millis()),
                "rate limited; every call held"
            ),
            Notice::CapacityPaused {
                provider,
                instance_type,
                until,
            } => tracing::warn!(
                provider = pname(provider),
                instance_type = instance_type.as_deref().unwrap_or("all"),
                until = %berth_core::duration::rfc3339(until.as_millis()),
                "no capacity; instance type paused"
            ),
            Notice::LeaseExpired {
                requestor,
                failed,
                reclaimed,
            } => tracing::warn!(
                %requestor,
                failed,
                reclaimed,
                "a requestor stopped renewing its lease; its pending requests failed and its nodes were taken back"
            ),
            Notice::Quarantined {
                provider,
                count,
                named,
            } => {
                let named: Vec<String> = named
                    .iter()
                    .map(|(id, q)| match &q.node {
                        Some(node) => format!("{id} (node {node}): {}", q.why),
                        None => format!("{id}: {}", q.why),
                    })
                    .collect();
                tracing::error!(
                    provider = pname(provider),
                    count,
                    instances = %named.join("; "),
                    "instances with this pool's tags are in quarantine: berth neither hands them out nor deletes them; look at them (GET /v1/providers), then delete them in the cloud or adopt them on purpose (docs/tags.md)"
                )
            }
            Notice::StoreMismatch { provider, why } => tracing::error!(
                provider = pname(provider),
                %why,
                "this store is not the one the provider's instances of the pool were made by, as far as it can tell: nothing is created on the provider, and none of them is handed out or deleted. Put back the store that made them and restart, delete them in the cloud, or adopt them on purpose by starting once with `berth serve --adopt-instances` (docs/tags.md)"
            ),
            Notice::StoreMismatchEnded { provider } => tracing::info!(
                provider = pname(provider),
                "the provider's lists no longer show instances this store cannot vouch for: creates there go on"
            ),
            Notice::HeldByTags {
                node,
                instance,
                why,
            } => tracing::error!(
                %node,
                %instance,
                %why,
                "the store does not have this node in use, but its instance's tags say it is handed out: the node is put on hold (never handed out nor deleted); `berth run` hands it out again, `berth delete` deletes it"
            ),
        }
    }
}
