//! What placements cost against what a tenant may spend: the premium budgets of `balanced` and
//! `max_cost_premium` (each placement's cost against its cheapest candidate's), and the tenant budgets a job's
//! expected spend is held to.

use super::Reactor;
use crate::journal::Journal;
use crate::placement::{self, Outcome, Request};
use crate::Millis;
use meridian_federation::{JobId, JobSpec, TenantId};

impl<J: Journal> Reactor<J> {
    /// The premium rule a job is placed under, and the key its spending is counted under; none for rules
    /// without a premium, baselines, and journals before format 4.
    pub(super) fn premium_key(&self, spec: &JobSpec) -> Option<(TenantId, String)> {
        let policy = placement::policy_of(spec, self.queue_policy(spec));
        let rule = placement::Rule::of(&policy, self.state.format());
        (self.baseline.is_none() && rule.premium().is_some())
            .then(|| (spec.tenant.clone(), policy.label()))
    }

    /// The policy of the job's queue, where the tenancy gives it one.
    pub(super) fn queue_policy(&self, spec: &JobSpec) -> Option<&meridian_federation::Policy> {
        self.tenancy
            .as_ref()?
            .queue_of(&spec.tenant, spec.queue.as_ref())
            .ok()?
            .policy
            .as_ref()
    }

    /// What the job's tenant has spent under the job's premium rule.
    pub(super) fn spent(&self, spec: &JobSpec) -> placement::Spent {
        self.premium_key(spec)
            .and_then(|k| self.state.premiums.get(&k).copied())
            .unwrap_or_default()
    }

    /// Counts a placement under a premium rule: its cost, and the cost of the cheapest candidate it was chosen
    /// among (the ready candidates of the chosen tier).
    pub(super) fn count_premium(&mut self, id: &JobId, decision: &placement::Decision) {
        let (Some(job), Outcome::Place(choice)) = (self.state.jobs.get(id), &decision.outcome)
        else {
            return;
        };
        let Some(key) = self.premium_key(&job.spec) else {
            return;
        };
        let cheapest = decision
            .candidates
            .iter()
            .filter(|c| c.tier == choice.tier)
            .filter(|c| matches!(c.reject, None | Some(placement::Reject::Outscored)))
            .filter_map(|c| c.terms.as_ref().map(|t| t.cost_micro_usd))
            .min()
            .unwrap_or(choice.terms.cost_micro_usd);
        self.state
            .premiums
            .entry(key)
            .or_default()
            .add(choice.terms.cost_micro_usd, cheapest);
    }

    /// Why a job of `spec` would take its tenant over budget `b` (`None` if it fits): its expected spend is the
    /// estimate at `choice`, or at the placement the broker would choose now.
    pub(super) fn over_budget(
        &self,
        b: &crate::budget::Budget,
        spec: &JobSpec,
        choice: Option<&placement::Choice>,
        now: Millis,
    ) -> Option<String> {
        let terms = match choice {
            Some(c) => Some(c.terms.clone()),
            None => {
                let request = Request {
                    spec,
                    waited_ms: u64::MAX,
                    refused: &[],
                    capped: &[],
                    baseline: self.baseline,
                    spent: self.spent(spec),
                    queue_policy: self.queue_policy(spec),
                };
                match placement::place(self.view(), request, now).outcome {
                    Outcome::Place(c) => Some(c.terms),
                    Outcome::Wait(_) => None,
                }
            }
        };
        let expected = terms.map_or_else(Default::default, |t| meridian_federation::Amounts {
            cost_micro_usd: t.cost_micro_usd,
            energy_wh: t.energy_wh,
            co2_g: t.co2_g,
        });
        let (from, to) = crate::budget::period(now, b.period);
        let used = self.budget_used(&b.tenant, from, to);
        crate::budget::over(b, &used, &expected)
    }
}
