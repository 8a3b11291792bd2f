//! Shrinking a failing plan: the shortest subsequence of its steps that still fails, found by
//! removing chunks of steps, halving their size down to one step, until no removal keeps it
//! failing (delta debugging). Any subsequence of a plan is a plan ([`crate::plan`]).

/// The shortest plan found, from `steps`, for which `fails` holds (it must hold for `steps`).
/// Tries at most `budget` plans.
pub fn shrink<Step: Copy>(steps: &[Step], mut budget: usize, mut fails: impl FnMut(&[Step]) -> bool) -> Vec<Step> {
    let mut plan = steps.to_vec();
    let mut chunk = plan.len().div_ceil(2).max(1);
    loop {
        let mut removed_any = false;
        let mut start = 0;
        while start < plan.len() && budget > 0 {
            let end = (start + chunk).min(plan.len());
            let candidate: Vec<Step> = plan[..start].iter().chain(&plan[end..]).copied().collect();
            budget -= 1;
            if fails(&candidate) {
                plan = candidate;
                removed_any = true;
            } else {
                start = end;
            }
        }
        if budget == 0 || (chunk == 1 && !removed_any) {
            return plan;
        }
        if !removed_any {
            chunk = chunk.div_ceil(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Step;

    #[test]
    fn shrinks_to_the_steps_that_matter() {
        let steps: Vec<Step> = (0..40u32).map(|ms| Step::Advance { ms }).collect();
        // Fails while it holds the steps of 7 and 30 ms.
        let matters = |plan: &[Step]| {
            [7, 30].iter().all(|want| plan.iter().any(|s| matches!(s, Step::Advance { ms } if ms == want)))
        };
        let shrunk = shrink(&steps, 1000, matters);
        assert_eq!(shrunk, vec![Step::Advance { ms: 7 }, Step::Advance { ms: 30 }]);
    }
}
