"""Mutation check: plant one plausible bug at a time and make sure a test catches it.

Usage (from the repository root, with the test environment active):

    python tests/mutation_check.py            # every mutant (see --list; CONTRIBUTING: time)
    python tests/mutation_check.py --list     # the mutants and the tests run against each
    python tests/mutation_check.py --only stats_n_instead_of_n_minus_1 --only tau_plus_scale

For each mutant the repository is copied to a temporary directory (the working tree is
never modified), ONE exact text replacement is made in `tf_adabatch/`, and the mutant's
tests run there (`PYTHONPATH` = the copy, `-x`, bounded by a timeout). Results:

    CAUGHT       a test failed (named)
    MISSED       every test passed: the suite does not see this bug
    NOT APPLIED  the anchor text is not in the file exactly once: the code moved and the
                 mutant must be re-anchored (a failure of the check itself)

First the unmutated copy runs every selected test once (the baseline; skip it with
--no-baseline): if it fails, the check stops with exit code 2.

At the end a table counts, per module of `tf_adabatch/`, the mutants run and caught.
The exit code is 0 only if every mutant was CAUGHT. Not part of `pytest` (the file name
does not match `test_*.py`). Run it before and after changing the engine.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600

G = "tests/test_guarantees.py"
SD = "tests/test_second_day.py"
WD = "tests/test_workdir.py"
CLOSED_FORM = f"{G}::test_statistics_gain_progress_lr_and_similarity_equal_the_closed_form"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, run in this order with -x
    why: str


MUTANTS = [
    # ---------------------------------------------------------------- statistics
    Mutant(
        "stats_n_instead_of_n_minus_1",
        "tf_adabatch/stats.py",
        "denom = tf.where(n >= 2.0, n - 1.0,",
        "denom = tf.where(n >= 2.0, n,",
        (CLOSED_FORM, "tests/test_engine_golden.py"),
        "the unbiased estimator divides by n - 1",
    ),
    Mutant(
        "stats_trace_drops_factor_m",
        "tf_adabatch/stats.py",
        "trace_sigma = m * n * (mean_sq - grad_mean_sq) / denom",
        "trace_sigma = n * (mean_sq - grad_mean_sq) / denom",
        (CLOSED_FORM,),
        "tr(Sigma) is per example: the micro-batch size m multiplies",
    ),
    Mutant(
        "stats_grad_sqr_drops_factor_n",
        "tf_adabatch/stats.py",
        "grad_sqr = (n * grad_mean_sq - mean_sq) / denom",
        "grad_sqr = (grad_mean_sq - mean_sq) / denom",
        (CLOSED_FORM, "tests/test_engine_golden.py"),
        "|G|^2 = (n |gbar|^2 - mean_sq) / (n - 1)",
    ),
    Mutant(
        "engine_grad_mean_sq_divides_by_n_once",
        "tf_adabatch/measure.py",
        "grad_mean_sq = total_sq / tf.square(tf.cast(reading.num_micro, _F64))",
        "grad_mean_sq = total_sq / tf.cast(reading.num_micro, _F64)",
        (CLOSED_FORM,),
        "|gbar|^2 = |sum|^2 / n^2 in exact mode",
    ),
    Mutant(
        "stats_ema_not_debiased",
        "tf_adabatch/stats.py",
        "decay * _f64(weight) + (1.0 - decay),",
        "tf.ones_like(_f64(weight)),",
        (CLOSED_FORM, "tests/test_stats.py"),
        "the moving average is debiased by 1 - decay^t",
    ),
    # ---------------------------------------------------------------- gain
    Mutant(
        "gain_scale_from_base_batch",
        "tf_adabatch/step_statistics.py",
        "S.adascale_gain(grad_sqr, trace, batch, b0)",
        "S.adascale_gain(grad_sqr, trace, b0, b0)",
        (CLOSED_FORM, "tests/test_engine_golden.py"),
        "S = B / B0 with the current batch B, not B0",
    ),
    Mutant(
        "gain_inputs_swapped",
        "tf_adabatch/step_statistics.py",
        "S.adascale_gain(grad_sqr, trace, batch, b0)",
        "S.adascale_gain(trace, grad_sqr, batch, b0)",
        (CLOSED_FORM, "tests/test_engine_golden.py"),
        "the audit's one caught mutant: |G|^2 and tr(Sigma) in the right places",
    ),
    Mutant(
        "gain_denominator_uses_b0",
        "tf_adabatch/stats.py",
        "den = tr / b + mu2",
        "den = tr / b0 + mu2",
        ("tests/test_stats.py", CLOSED_FORM),
        "r = (tr/B0 + |G|^2) / (tr/B + |G|^2)",
    ),
    # ---------------------------------------------------------------- progress, LR
    Mutant(
        "tau_plus_scale",
        "tf_adabatch/schedules.py",
        'return tf.cast(gain if self.rule == "adascale" else scale, tf.float64)',
        "return tf.cast(scale, tf.float64)",
        (CLOSED_FORM, "tests/test_schedules.py"),
        "AdaScale advances tau by the gain r, not by S",
    ),
    Mutant(
        "lr_reads_base_at_optimizer_step",
        "tf_adabatch/schedules.py",
        "base = tf.cast(self.base_learning_rate(tf.floor(progress)), tf.float64)",
        "base = tf.cast(self.base_learning_rate(tf.cast(state.steps, tf.float64)), tf.float64)",
        (CLOSED_FORM, "tests/test_schedules.py"),
        "the base schedule is read at floor(tau), not at the optimizer step",
    ),
    # ---------------------------------------------------------------- similarity, groups
    Mutant(
        "estimated_similarity_factor_2_to_1",
        "tf_adabatch/stats.py",
        "den = g + 2.0 * _f64(trace_sigma) / _f64(batch_size)",
        "den = g + _f64(trace_sigma) / _f64(batch_size)",
        ("tests/test_stats.py", "tests/test_estimated_similarity.py"),
        "each half has B/2 examples: c = |G|^2 / (|G|^2 + 2 tr/B) (one replica's estimate)",
    ),
    Mutant(
        "replica_similarity_maps_to_the_whole_batch",
        "tf_adabatch/stats.py",
        "den = (n - 2.0) * c1 + 2.0",
        "den = (n - 1.0) * c1 + 1.0",
        (CLOSED_FORM, "tests/test_stats.py"),
        "the replicas' cosine (B/N examples) is carried to half-batches (B/2), not to B",
    ),
    Mutant(
        "replica_similarity_arithmetic_mean_of_norms",
        "tf_adabatch/stats.py",
        "pairs = r * r - q",
        "pairs = q",
        ("tests/test_stats.py", CLOSED_FORM),
        "each pair's inner product over the product of its norms (with N = 2 the exact cosine)",
    ),
    Mutant(
        "replica_norm_of_the_last_micro_step_only",
        "tf_adabatch/measure.py",
        "lambda: S.sum_of_squares(local), lambda: scalars[0])",
        "lambda: scalars[0], lambda: scalars[0])",
        (CLOSED_FORM,),
        "a replica's norm is that of its whole gradient sum h_r, not of its last micro-gradient",
    ),
    Mutant(
        "exact_cosine_cross_term_sign",
        "tf_adabatch/measure.py",
        "sq_a = (total_sq + 2.0 * cross + diff_sq) / 4.0",
        "sq_a = (total_sq - 2.0 * cross + diff_sq) / 4.0",
        (
            CLOSED_FORM,
            "tests/test_engine_equivalence.py::test_exact_similarity_equals_cosine_of_group_means",
        ),
        "|A|^2 = (|T|^2 + 2 T.D + |D|^2) / 4",
    ),
    Mutant(
        "groups_halves_instead_of_parity",
        "tf_adabatch/measure.py",
        "odd_replica = tf.math.floormod(replica, 2) == 1",
        "odd_replica = tf.math.floordiv(replica, 2) == 1",
        (
            CLOSED_FORM,
            "tests/test_engine_equivalence.py::test_exact_similarity_equals_cosine_of_group_means",
        ),
        "even N: group A = even replicas (with N = 4, halves would be a different split)",
    ),
    Mutant(
        "odd_replicas_stale_slot_read_with_one_micro_step",
        "tf_adabatch/measure.py",
        "even_ok = (k >= 2) | (tf.math.floormod(replica, 2) == 0)",
        "even_ok = k >= 1",
        (CLOSED_FORM,),
        "odd N, k = 1: a replica's other slot holds an earlier step's gradient",
    ),
    Mutant(
        "odd_replicas_second_slot_not_overwritten",
        "tf_adabatch/measure.py",
        "lambda: _set_or_add(self.acc_odd, grads, micro_index < 2),",
        "lambda: _set_or_add(self.acc_odd, grads, micro_index < 1),",
        (
            CLOSED_FORM,
            "tests/test_engine_equivalence.py::test_other_replica_counts_equal_one_device",
        ),
        "odd N: a slot's first micro-step may be i = 1 and must overwrite",
    ),
    # ---------------------------------------------------------------- skip path
    Mutant(
        "skip_applies_anyway",
        "tf_adabatch/engine.py",
        "tf.cond(finite, lambda: strategy.run(self._apply_fn",
        "tf.cond(tf.constant(True), lambda: strategy.run(self._apply_fn",
        (
            "tests/test_engine_equivalence.py::test_non_finite_micro_batch_skips_the_step_and_corrupts_nothing",
        ),
        "a non-finite step must not reach the optimizer",
    ),
    Mutant(
        "skip_counted_wrong",
        "tf_adabatch/step_statistics.py",
        "skipped = state.skipped_steps.read_value() + (1 - applied)",
        "skipped = state.skipped_steps.read_value() + tf.ones_like(applied)",
        (
            f"{G}::test_a_skipped_step_under_smoothed_simigrad_changes_neither_batch_nor_policy_state",
            "tests/test_engine_equivalence.py::test_non_finite_micro_batch_skips_the_step_and_corrupts_nothing",
        ),
        "skipped_steps counts skipped steps only",
    ),
    Mutant(
        "odd_exact_fuses_the_last_micro_step",
        "tf_adabatch/measure.py",
        "self.fuses_last_micro_step = not self.two_slots",
        "self.fuses_last_micro_step = True",
        (
            CLOSED_FORM,
            "tests/test_engine_equivalence.py::test_other_replica_counts_equal_one_device",
        ),
        "odd N in exact mode: the last micro-step must be accumulated into its group's slot",
    ),
    Mutant(
        "skip_updates_moving_averages",
        "tf_adabatch/step_statistics.py",
        "kept[name] = tf.where(applied, stats.new[name], stats.old[name])",
        "kept[name] = stats.new[name]",
        (
            "tests/test_engine_equivalence.py::test_non_finite_micro_batch_skips_the_step_and_corrupts_nothing",
        ),
        "a skipped step leaves the averages alone",
    ),
    Mutant(
        "goodput_learns_from_skipped_steps",
        "tf_adabatch/step_logs.py",
        "            if applied:\n",
        "            if True:\n",
        ("tests/test_goodput.py::test_a_skipped_step_teaches_the_throughput_model_nothing",),
        "the throughput model learns from applied steps only (a skipped step's time is not a step's)",
    ),
    Mutant(
        "goodput_exploration_skips_the_top",
        "tf_adabatch/policies.py",
        "step = tf.where(current + unit <= self.max_batch_size,",
        "step = tf.where(current + unit < self.max_batch_size,",
        (
            "tests/test_goodput.py::test_exploration_at_the_top_tries_the_largest_batch_and_never_passes_it",
        ),
        "exploring one unit below the top tries max_batch_size itself",
    ),
    Mutant(
        "rollback_skips_the_local_finiteness_check",
        "tf_adabatch/rollback.py",
        "            if check_finite:\n                self._checked.extend(sources)",
        "            if False:\n                self._checked.extend(sources)",
        (
            "tests/test_rollback.py::test_an_update_that_leaves_only_a_moving_statistic_infinite_is_skipped_and_undone",
        ),
        "a step that leaves only a moving statistic non-finite is skipped",
    ),
    Mutant(
        "sigterm_at_start_up_forgotten",
        "tf_adabatch/app/preemption.py",
        "        self.manager = manager\n        self.reinstall()",
        "        self.manager = manager\n        self.signalled = False\n        self.reinstall()",
        (
            "tests/test_preemption.py::test_a_sigterm_while_the_run_starts_is_kept_and_saves_at_the_first_step",
        ),
        "a SIGTERM before the checkpoint manager exists still saves at the first step",
    ),
    Mutant(
        "carry_uses_the_new_unit",
        "tf_adabatch/resume.py",
        "batch = int(state.accumulation_steps.numpy()) * saved",
        "batch = int(state.accumulation_steps.numpy()) * unit",
        (
            "tests/test_checkpoints.py::test_two_resumes_on_other_replica_counts_keep_the_global_batch_written_by_hand",
        ),
        "a resume on another replica count keeps the saved global batch (k x the saved unit)",
    ),
    Mutant(
        "estimated_similarity_at_the_micro_batch",
        "tf_adabatch/measure.py",
        "similarity = S.estimated_similarity(moments.grad_sqr, moments.trace_sigma, batch)",
        "similarity = S.estimated_similarity(moments.grad_sqr, moments.trace_sigma, batch / tf.cast(reading.num_micro, batch.dtype))",
        (
            "tests/test_estimated_similarity.py::test_one_replica_at_a_batch_other_than_b0_gives_the_closed_form_of_its_micro_gradients",
        ),
        "one replica's estimated similarity is read at the step's batch B",
    ),
    Mutant(
        "norm_test_rounds_down",
        "tf_adabatch/critical_batch.py",
        "units = tf.math.ceil(tf.minimum(needed, float(self.max_batch_size)) / self.batch_unit)",
        "units = tf.math.floor(tf.minimum(needed, float(self.max_batch_size)) / self.batch_unit)",
        ("tests/test_critical_batch.py",),
        "the norm test's batch is the smallest multiple of the unit that passes",
    ),
    Mutant(
        "seesaw_grows_at_the_boundary",
        "tf_adabatch/critical_batch.py",
        "tf.constant(self.decay_points, tf.float64) < tau",
        "tf.constant(self.decay_points, tf.float64) <= tau",
        ("tests/test_critical_batch.py",),
        "Seesaw's batch grows past a decay point, when Keras's step schedule decays",
    ),
    Mutant(
        "skip_feeds_the_policy",
        "tf_adabatch/step_statistics.py",
        "proposed = tf.cond(\n            finite,",
        "proposed = tf.cond(\n            tf.constant(True),",
        (
            f"{G}::test_a_skipped_step_under_smoothed_simigrad_changes_neither_batch_nor_policy_state",
        ),
        "a skipped step leaves the policy state alone (smoothed SimiGrad)",
    ),
    # ---------------------------------------------------------------- checkpoints
    Mutant(
        "trainer_checkpoint_drops_policy",
        "tf_adabatch/trainer.py",
        "for name, part in self.engine.adaptive_state().items()\n",
        'for name, part in self.engine.adaptive_state().items()\n                if name != "policy"\n',
        (f"{G}::test_the_trainer_checkpoint_holds_the_policy_state",),
        "Trainer.checkpoint holds the policy's state",
    ),
    Mutant(
        "trainer_checkpoint_drops_carried_buffers",
        "tf_adabatch/trainer.py",
        "for name, part in self.engine.adaptive_state().items()\n",
        'for name, part in self.engine.adaptive_state().items()\n                if name != "carried"\n',
        ("tests/test_trainer.py::test_one_replica_estimated_mode_resumes_exactly",),
        "the differenced estimator's previous gradient is saved",
    ),
    Mutant(
        "keras_saveable_drops_policy",
        "tf_adabatch/keras_fit.py",
        'out.update({f"{name}.{_key(v)}": v for v in part.variables})',
        'out.update({f"{name}.{_key(v)}": v for v in part.variables if name != "policy"})',
        (f"{G}::test_a_keras_save_of_another_policys_state_is_refused",),
        "Keras saves of an attached model hold the policy state",
    ),
    # ---------------------------------------------------------------- regularizers
    Mutant(
        "weight_regularizers_in_micro_steps",
        "tf_adabatch/_keras_seams.py",
        "return list(losses[: len(losses) - n_weight])",
        "return list(losses)",
        (f"{G}::test_weight_regularizers_stay_out_of_the_statistics_and_the_similarity",),
        "weight regularizers stay out of the statistics and the similarity",
    ),
    # ---------------------------------------------------------------- policies
    Mutant(
        "simigrad_grows_when_it_should_shrink",
        "tf_adabatch/policies.py",
        "tf.where(c > target, -delta, tf.zeros_like(delta))",
        "tf.where(c > target, delta, tf.zeros_like(delta))",
        ("tests/test_policies.py",),
        "c > target shrinks the batch",
    ),
    Mutant(
        "policy_ignores_bounds",
        "tf_adabatch/policies.py",
        "return tf.clip_by_value(\n            tf.cast(batch_size, tf.int64), self.min_batch_size, self.max_batch_size\n        )",
        "return tf.cast(batch_size, tf.int64)",
        ("tests/test_policies.py",),
        "batches stay within [min, max]",
    ),
    Mutant(
        "simigrad_smoothing_ignored",
        "tf_adabatch/policies.py",
        'return tf.where(weight > 0, biased / tf.where(weight > 0, weight, 1.0), float("nan"))',
        "return tf.cast(similarity, tf.float64)",
        ("tests/test_policies.py",),
        "with smoothing the controller acts on the debiased average",
    ),
    # ------------------------------------------------------------- roll-back
    Mutant(
        "rollback_finiteness_ignores_the_weights",
        "tf_adabatch/rollback.py",
        "for v in self._checked + self.mirrored:",
        "for v in self._checked:",
        ("tests/test_rollback.py",),
        "the finiteness check reads the weights and optimizer slots, not only per-device copies",
    ),
    Mutant(
        "rollback_finiteness_tests_one_variable",
        "tf_adabatch/rollback.py",
        "checks.append(tf.math.is_finite(tf.add_n(sums)))",
        "checks.append(tf.math.is_finite(sums[0]))",
        ("tests/test_rollback.py",),
        "the finiteness check tests the sum of every variable, not the first one's",
    ),
    Mutant(
        "scalar_limbs_drop_the_low_limb",
        "tf_adabatch/measure.py",
        "return parts[0] + (parts[1] + parts[2])",
        "return parts[0] + parts[1]",
        ("tests/test_scalar_transport.py",),
        "the scalars that ride in the gradient all-reduce keep float64 precision",
    ),
    Mutant(
        "rollback_restore_local_does_nothing",
        "tf_adabatch/rollback.py",
        "            source.assign(copy.read_value(), read_value=False)",
        "            pass",
        ("tests/test_rollback.py",),
        "restoring the per-device copies writes them back (StepRollback itself, not its caller)",
    ),
    Mutant(
        "options_unknown_name_accepted",
        "tf_adabatch/options.py",
        "        if name not in known:",
        "        if False:",
        ("tests/test_inputs.py::test_every_front_door_takes_the_same_engine_options",),
        "an unknown engine option (a typo) is refused by name at every front door",
    ),
    Mutant(
        "skip_keeps_forward_pass_writes",
        "tf_adabatch/engine.py",
        "tf.cond(applied, lambda: None, self._rollback.restore_local)",
        "tf.cond(applied, lambda: None, lambda: None)",
        ("tests/test_rollback.py",),
        "a skipped step restores BatchNormalization statistics and seed generators",
    ),
    Mutant(
        "non_finite_update_kept",
        "tf_adabatch/engine.py",
        "tf.cond(lost, self._rollback.restore_mirrored, lambda: None)",
        "tf.cond(lost, lambda: None, lambda: None)",
        ("tests/test_rollback.py",),
        "an update that leaves a weight or slot non-finite is rolled back",
    ),
    Mutant(
        "finish_not_compiled_on_one_replica",
        "tf_adabatch/engine.py",
        "self._finish_fn = wrap(self._finish_step) if single else self._finish_step",
        "self._finish_fn = self._finish_step",
        (
            "tests/test_xla_step.py::test_on_one_mirrored_replica_the_step_after_its_data_is_one_xla_program",
        ),
        "with jit_compile=True the step after its data (roll-back, policy) is one XLA program",
    ),
    Mutant(
        "roll_back_save_not_compiled_on_one_replica",
        "tf_adabatch/engine.py",
        "self._save_fn = wrap(self._rollback.save) if single else self._rollback.save",
        "self._save_fn = self._rollback.save",
        (
            "tests/test_xla_step.py::test_on_one_mirrored_replica_the_step_after_its_data_is_one_xla_program",
        ),
        "with jit_compile=True the roll-back's save compiles too",
    ),
    Mutant(
        "checkpoint_only_at_multiples_with_blocks",
        "tf_adabatch/app/loop.py",
        "passed = step // self.every > self.told // self.every",
        "passed = step % self.every == 0",
        ("tests/test_launch_blocks.py",),
        "with steps_per_execution a checkpoint is taken at the end of a block that passed a multiple",
    ),
    Mutant(
        "virtual_clock_charges_a_blocks_last_step_only",
        "tf_adabatch/app/loop.py",
        'seconds = logs.get(BLOCK_SECONDS, logs.get("step_time"))',
        'seconds = logs.get("step_time")',
        ("tests/test_launch_blocks.py",),
        "the launcher's virtual clock charges every step of a block",
    ),
    Mutant(
        "block_ignores_the_progress_budget",
        "tf_adabatch/engine.py",
        "more = (i < steps) & (state.progress.read_value() < until)",
        "more = i < steps",
        (
            "tests/test_steps_per_execution.py::test_a_progress_budget_ends_the_block_on_the_step_that_reaches_it",
        ),
        "a block of steps ends on the step that reaches the progress budget",
    ),
    Mutant(
        "block_ignores_the_skip_limit",
        "tf_adabatch/engine.py",
        "more = more & ((limit < 0) | (state.consecutive_skips.read_value() < limit))",
        "more = more",
        ("tests/test_steps_per_execution.py::test_the_skip_limit_ends_a_block_and_raises",),
        "a block of steps ends at max_consecutive_skips",
    ),
    Mutant(
        "block_runs_past_a_lost_update",
        "tf_adabatch/engine.py",
        "                more = more & ~lost",
        "                more = more",
        (
            "tests/test_rollback.py::test_rollback_stop_keeps_no_copy_and_stops_on_a_non_finite_update",
        ),
        'with rollback="stop" a block ends on the step whose update was not finite',
    ),
    Mutant(
        "stop_mode_ignores_a_lost_update",
        "tf_adabatch/step_logs.py",
        "if lost.any() and not update_undone:",
        "if False:",
        (
            "tests/test_rollback.py::test_rollback_stop_keeps_no_copy_and_stops_on_a_non_finite_update",
        ),
        'with rollback="stop" a non-finite update stops the run (no copy to undo it)',
    ),
    Mutant(
        "block_time_not_shared_among_its_steps",
        "tf_adabatch/clock.py",
        "each = seconds / len(batch_sizes)",
        "each = seconds",
        ("tf_adabatch/clock.py::tf_adabatch.clock.charge",),
        "a host clock charges each step of a block the block's time / its steps",
    ),
    Mutant(
        "non_finite_update_counted_applied",
        "tf_adabatch/engine.py",
        "applied = finite & update_ok",
        "applied = finite",
        ("tests/test_rollback.py",),
        "a non-finite update counts as a skipped step",
    ),
    Mutant(
        "skip_leaves_metrics_updated",
        "tf_adabatch/engine.py",
        "self._rollback.add_local(metrics, check_finite=False)",
        "pass",
        ("tests/test_rollback.py",),
        "under attach a skipped step leaves the compiled metrics alone",
    ),
    Mutant(
        "statistics_committed_on_a_failed_update",
        "tf_adabatch/step_statistics.py",
        "kept[name] = tf.where(applied, stats.new[name], stats.old[name])",
        "kept[name] = tf.where(stats.finite, stats.new[name], stats.old[name])",
        ("tests/test_rollback.py",),
        "a step whose update is not finite leaves the statistics (gain, averages) as they were",
    ),
    # ------------------------------------------------------ estimated similarity
    Mutant(
        "estimated_similarity_from_smoothed_moments",
        "tf_adabatch/measure.py",
        "similarity = S.estimated_similarity(moments.grad_sqr, moments.trace_sigma, batch)",
        "similarity = S.estimated_similarity(S.debias(self.state.grad_sqr_biased, self.state.ema_weight), S.debias(self.state.trace_sigma_biased, self.state.ema_weight), batch)",
        ("tests/test_estimated_similarity.py", CLOSED_FORM),
        "estimated mode reads the step's own moments (no lag)",
    ),
    # ---------------------------------------------------------------- goodput
    Mutant(
        "goodput_ignores_step_time",
        "tf_adabatch/policies.py",
        "gain / tf.where(seconds > 0.0, seconds, 1.0)",
        "gain / tf.where(seconds > 0.0, 1.0, 1.0)",
        ("tests/test_goodput.py",),
        "goodput maximises progress per second, not per step",
    ),
    Mutant(
        "goodput_no_hysteresis",
        "tf_adabatch/policies.py",
        "move = tf.reduce_max(rates) > (1.0 + self.hysteresis) *",
        "move = tf.reduce_max(rates) > (1.0 + 0.0) *",
        ("tests/test_goodput.py",),
        "the batch moves only for a predicted gain above the hysteresis",
    ),
    Mutant(
        "throughput_mean_instead_of_median",
        "tf_adabatch/throughput.py",
        "tf.gather(seconds, starts + (counts - 1) // 2) + tf.gather(seconds, starts + counts // 2)",
        "2.0 * tf.math.segment_mean(seconds, tf.repeat(tf.range(tf.size(counts), dtype=tf.int64), counts))",
        ("tests/test_goodput.py",),
        "per-k medians make the fit robust to outliers",
    ),
    Mutant(
        "throughput_window_not_circular",
        "tf_adabatch/throughput.py",
        "return tf.reshape(self.count % self.window, [1, 1])",
        "return tf.reshape(tf.minimum(self.count, self.window - 1), [1, 1])",
        ("tests/test_goodput.py",),
        "a full window replaces its oldest timing, so the model follows a changed machine",
    ),
    Mutant(
        "throughput_min_timings_ignored",
        "tf_adabatch/throughput.py",
        "kept = counts >= min_timings_per_k",
        "kept = counts >= 1",
        ("tests/test_goodput.py",),
        "a value of k counts in the fit only with min_timings_per_k timings",
    ),
    # ---------------------------------------------------------------- elastic resume, inputs
    Mutant(
        "resume_keeps_k_on_another_topology",
        "tf_adabatch/resume.py",
        "k = min(max(round(batch / unit), low), high)",
        "k = int(self.state.accumulation_steps.numpy())",
        (
            "tests/test_checkpoints.py::test_a_resume_on_another_batch_unit_keeps_the_global_batch",
            "tests/test_fit.py::test_keras_weights_files_carry_the_adaptive_state",
        ),
        "a resume on another replicas x micro-batch keeps the global batch, not k",
    ),
    Mutant(
        "sample_weight_column_not_squeezed",
        "tf_adabatch/losses.py",
        "while sw_rank > max(loss_rank, 1) and sw.shape[-1] == 1:",
        "while False:",
        ("tests/test_trainer_evaluate.py",),
        "sample weights of shape (batch, 1) weigh examples as Keras does",
    ),
    # ---------------------------------------------------------------- the second day
    Mutant(
        "load_model_skips_the_state",
        "tf_adabatch/keras_fit.py",
        "    model.load_weights(filepath)\n    return model, engine",
        "    return model, engine",
        (f"{SD}::test_load_model_continues_the_adaptive_state_as_if_never_stopped",),
        "tf_adabatch.load_model restores the adaptive state saved with the model",
    ),
    Mutant(
        "lr_callbacks_multiplier_ignored",
        "tf_adabatch/schedules.py",
        "            base = base * self._scale.scale.read_value()",
        "            base = base",
        (f"{SD}::test_reduce_lr_on_plateau_halves_the_base_rate_under_attach",),
        "Keras's learning-rate callbacks change the rate the optimizer applies",
    ),
    Mutant(
        "workdir_lock_not_taken",
        "tf_adabatch/app/workdir.py",
        "            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "            pass",
        ("tf_adabatch/app/workdir.py",),
        "a second run on a held workdir is refused",
    ),
    Mutant(
        "run_record_not_restored",
        "tf_adabatch/app/loop.py",
        "        record.restore_from(latest)",
        "        pass",
        (f"{WD}::test_the_records_accumulate_over_kills",),
        "train_seconds and the other records accumulate over a run's processes",
    ),
    Mutant(
        "fingerprint_not_recovered_from_checkpoints",
        "tf_adabatch/app/checkpoints.py",
        "        stored, readable = _fingerprint_in_checkpoints(directory)",
        "        stored, readable = None, False",
        (
            "tests/test_checkpoints.py::test_a_lost_fingerprint_file_is_recovered_from_the_checkpoint",
        ),
        "a deleted fingerprint.json does not let another seed resume",
    ),
    Mutant(
        "diverged_checkpoint_kept",
        "tf_adabatch/app/records.py",
        "            if self.exploding():\n                self._aside(pending)",
        "            if False:\n                self._aside(pending)",
        (
            f"{WD}::test_a_checkpoint_whose_weights_explode_is_set_aside_at_once_while_the_run_goes_on",
            f"{WD}::test_a_resume_that_diverges_leaves_the_good_checkpoint_for_a_sane_rerun",
        ),
        "a checkpoint whose weights' loss exploded is not the one a rerun resumes from",
    ),
    Mutant(
        "skipping_run_ends_as_success",
        "tf_adabatch/app/loop.py",
        "    elif consecutive:",
        "    elif False:",
        (f"{WD}::test_a_run_whose_steps_are_all_skipped_does_not_end_as_a_success",),
        "a run that ends skipping every step is not a success",
    ),
    Mutant(
        "ctrl_c_not_handled",
        "tf_adabatch/app/preemption.py",
        "_SIGNALS = (signal.SIGTERM, signal.SIGINT)",
        "_SIGNALS = (signal.SIGTERM,)",
        (f"{WD}::test_a_second_ctrl_c_quits_at_once",),
        "Ctrl-C saves and stops like SIGTERM",
    ),
    Mutant(
        "infinite_scalars_to_tensorboard",
        "tf_adabatch/summaries.py",
        "    array[np.isinf(array)] = np.nan\n",
        "",
        ("tf_adabatch/summaries.py",),
        "no infinite value blanks a TensorBoard chart",
    ),
    Mutant(
        "summaries_ignore_the_callers_record_if",
        "tf_adabatch/summaries.py",
        "tf.summary.record_if(record):",
        "tf.summary.record_if(True):",
        (
            "tests/test_summaries.py::test_step_scalars_are_written_by_one_compiled_call_per_tag_set",
        ),
        "the caller's recording condition holds for the compiled step writer",
    ),
    Mutant(
        "summaries_policy_lines_dropped",
        "tf_adabatch/summaries.py",
        "for name, value in policy_scalars(policy).items():",
        "for name, value in {}.items():",
        ("tests/test_summaries.py::test_policy_target_and_bounds_are_lines_at_every_step",),
        "the policy's target and bounds are drawn beside the batch size and similarity",
    ),
    Mutant(
        "state_file_lists_a_half_deleted_checkpoint",
        "tf_adabatch/app/checkpoints.py",
        'if n <= number and os.path.exists(os.path.join(directory, f"ckpt-{n}.index"))',
        "if n <= number",
        (
            "tests/test_checkpoints.py::test_an_older_checkpoint_half_deleted_by_a_killed_rotation_does_not_stop_the_resume",
        ),
        "a kill during the manager's rotation does not stop the next resume",
    ),
    Mutant(
        "damaged_checkpoint_left_in_place",
        "tf_adabatch/app/checkpoints.py",
        'moved = _move_aside(directory, bad, stamp) if repair else "left in place"',
        'moved = "left in place"',
        (
            "tests/test_checkpoints.py::test_damaged_newest_checkpoint_is_passed_over_kept_aside_and_its_number_reused",
        ),
        "a damaged checkpoint is renamed aside, so its number is reused by the next save",
    ),
    Mutant(
        "second_ctrl_c_does_not_quit",
        "tf_adabatch/app/preemption.py",
        "            raise KeyboardInterrupt  # a second Ctrl-C: quit at once",
        "            pass  # a second Ctrl-C: quit at once",
        (f"{WD}::test_a_second_ctrl_c_quits_at_once",),
        "a second Ctrl-C quits at once, without saving",
    ),
    # ---------------------------------------------------------------- the language model
    Mutant(
        "text_labels_not_shifted",
        "tf_adabatch/app/data/python_text.py",
        "y = array[1 : n * sequence_length + 1].reshape(n, sequence_length)",
        "y = array[: n * sequence_length].reshape(n, sequence_length)",
        ("tests/test_text_lm.py::test_windows_pair_each_byte_with_the_next_one",),
        "each position's label is the byte after it (the model would learn to copy)",
    ),
    Mutant(
        "text_corpus_hash_unchecked",
        "tf_adabatch/app/data/python_text.py",
        "if digest != SHA256[split]:",
        "if False:",
        (
            "tests/test_text_lm.py::test_a_corpus_that_differs_is_refused_with_one_line_naming_the_split_and_both_hashes",
        ),
        "a corpus that differs from the pinned one must not silently train",
    ),
    Mutant(
        "transformer_sees_the_future",
        "tf_adabatch/app/models.py",
        "use_causal_mask=True",
        "use_causal_mask=False",
        ("tests/test_text_lm.py::test_the_transformer_is_causal_and_its_size_is_derived_by_hand",),
        "a language model's position must not attend to later bytes",
    ),
    Mutant(
        "bits_per_byte_in_nats",
        "tf_adabatch/app/loop.py",
        "    return nats / math.log(2.0)",
        "    return nats",
        ("tf_adabatch/app/loop.py::tf_adabatch.app.loop.bits_per_byte",),
        "bits per byte is the cross-entropy in nats divided by ln 2",
    ),
    # ------------------------------------------- issue 42: saying what went wrong
    Mutant(
        "evaluation_empty_replica_counts_nan",
        "tf_adabatch/evaluation.py",
        "loss = tf.where(batch > 0, tf.reduce_mean(loss), 0.0)",
        "loss = tf.reduce_mean(loss)",
        (
            "tests/test_trainer_evaluate.py::test_batches_smaller_than_or_not_divisible_by_the_replicas_match_one_replica",
        ),
        "a replica without examples must add nothing to the loss (its mean over none is NaN)",
    ),
    Mutant(
        "non_finite_evaluation_called_divergence",
        "tf_adabatch/app/loop.py",
        "        if math.isfinite(on_train):",
        "        if False:",
        (
            "tests/test_honest_failures.py::test_a_non_finite_test_set_with_a_finite_training_loss_is_not_called_a_divergence",
        ),
        "a non-finite test loss is a divergence only if training's loss is not finite too",
    ),
    Mutant(
        "attach_skipped_step_shows_the_metrics_mean",
        "tf_adabatch/keras_fit.py",
        'out["loss"] = math.nan if lost[-1] else float(logs["loss"][-1])',
        "pass",
        (
            "tests/test_fit_keras.py::test_skipped_steps_show_their_loss_a_count_a_warning_and_terminate_on_nan_stops",
        ),
        "an epoch of skipped steps must show nan (it showed 0.0: the restored metrics)",
    ),
    Mutant(
        "attach_skip_cause_ignores_the_lost_update",
        "tf_adabatch/keras_fit.py",
        "        if update[first]:",
        "        if False:",
        (
            "tests/test_fit_keras.py::test_skipped_steps_show_their_loss_a_count_a_warning_and_terminate_on_nan_stops",
        ),
        "the first skip's warning names its cause: the update, not the gradients",
    ),
    Mutant(
        "progress_bar_hides_skipped_steps",
        "tf_adabatch/trainer.py",
        """            *_PROGRESS_KEYS[1:],
            "skipped_steps",""",
        "            *_PROGRESS_KEYS[1:],",
        ("tests/test_trainer.py::test_progress_bar_shows_the_skipped_steps",),
        "the launcher's progress line counts the skipped steps",
    ),
    Mutant(
        "orphan_data_left_in_place",
        "tf_adabatch/app/checkpoints.py",
        'if "index" not in parts:',
        "if False:",
        ("tests/test_checkpoints.py::test_leftovers_of_killed_saves_are_set_aside_with_one_line",),
        "a checkpoint's data without its index (a kill in the rotation) is set aside, not left",
    ),
    Mutant(
        "stopped_weights_not_judged",
        "tf_adabatch/app/records.py",
        """        if self.factor is not None and step is not None:
            self._next_loss[step] = loss""",
        """        if False:
            self._next_loss[step] = loss""",
        (
            "tests/test_workdir.py::test_after_an_exploding_update_the_error_says_what_a_rerun_at_a_sane_rate_does",
        ),
        "a checkpoint of exploded weights (its next steps skipped) must not be recommended",
    ),
    # ------------------------------------------ properties over the options (issue 43)
    Mutant(
        "critical_warmup_checks_current_not_grown",
        "tf_adabatch/critical_batch.py",
        "wanted = critical >= self.margin * tf.cast(grown, tf.float64)",
        "wanted = critical >= self.margin * tf.cast(current, tf.float64)",
        (
            "tests/test_policy_properties.py::test_critical_warmup_grows_by_its_factor_where_the_noise_scale_allows",
        ),
        "the warm-up grows only if the noise scale allows the grown batch",
    ),
    Mutant(
        "seesaw_point_belongs_to_the_next_interval",
        "tf_adabatch/critical_batch.py",
        "tf.constant(self.decay_points, tf.float64) < tau",
        "tf.constant(self.decay_points, tf.float64) <= tau",
        (
            "tests/test_policy_properties.py::test_seesaw_only_reaches_initial_times_powers_of_its_factor",
        ),
        "a decay point belongs to the interval before it (PiecewiseConstantDecay)",
    ),
    Mutant(
        "simigrad_interval_off_by_one",
        "tf_adabatch/policies.py",
        "due = tf.equal(tf.math.floormod(tf.cast(stats.step, tf.int64), self.interval), 0)",
        "due = tf.equal(tf.math.floormod(tf.cast(stats.step, tf.int64) + 1, self.interval), 0)",
        ("tests/test_policy_properties.py::test_simigrad_moves_at_most_its_step_every_interval",),
        "SimiGrad adjusts every `interval` applied steps",
    ),
    Mutant(
        "simigrad_step_rounds_up_too_far",
        "tf_adabatch/policies.py",
        "tf.floor(self.step * tf.cast(k, tf.float64) + 0.5)",
        "tf.floor(self.step * tf.cast(k, tf.float64) + 1.5)",
        ("tests/test_policy_properties.py::test_simigrad_moves_at_most_its_step_every_interval",),
        "SimiGrad moves by round(step x k) units, at least one",
    ),
    Mutant(
        "skipped_step_feeds_the_policy",
        "tf_adabatch/step_statistics.py",
        """            lambda: tf.cast(batch, tf.float64),
        )""",
        """            lambda: tf.cast(self.policy.next_batch_size(batch, stats), tf.float64),
        )""",
        (
            "tests/test_policy_properties.py::test_norm_test_grows_to_the_smallest_passing_multiple_and_never_shrinks",
            "tests/test_policy_properties.py::test_critical_warmup_grows_by_its_factor_where_the_noise_scale_allows",
            "tests/test_policy_properties.py::test_simigrad_moves_at_most_its_step_every_interval",
        ),
        "a skipped step leaves the policy and the batch alone",
    ),
    Mutant(
        "norm_test_theta_not_squared",
        "tf_adabatch/critical_batch.py",
        "self.theta**2",
        "self.theta",
        (
            "tests/test_policy_properties.py::test_norm_test_grows_to_the_smallest_passing_multiple_and_never_shrinks",
        ),
        "the norm test asks B >= noise scale / theta^2",
    ),
    # ------------------------------------------- the transformer's reference (issue 43)
    Mutant(
        "attention_on_the_raw_input",
        "tf_adabatch/app/models.py",
        "(h, h, use_causal_mask=True)",
        "(x, x, use_causal_mask=True)",
        ("tests/test_references.py",),
        "pre-LayerNorm: attention reads the normalized input",
    ),
    Mutant(
        "attention_keys_from_the_raw_input",
        "tf_adabatch/app/models.py",
        "(h, h, use_causal_mask=True)",
        "(h, x, use_causal_mask=True)",
        ("tests/test_references.py",),
        "queries, keys and values all come from the normalized input",
    ),
    Mutant(
        "feed_forward_relu",
        "tf_adabatch/app/models.py",
        'layers.Dense(4 * width, activation="gelu")(h)',
        'layers.Dense(4 * width, activation="relu")(h)',
        ("tests/test_references.py",),
        "the feed-forward layer is a gelu",
    ),
    # ---------------------------------------------------------- packaging (issue 44)
    Mutant(
        "config_name_not_resolved",
        "tf_adabatch/app/resources.py",
        "    if name in config_names():",
        "    if name in config_names() and False:",
        (
            "tests/test_launch.py::test_a_config_by_name_is_the_shipped_file_and_an_unknown_name_one_line",
        ),
        "--config=NAME runs the shipped config of that name",
    ),
    # --------------------------------------------- probing goodput policy (issue 45)
    Mutant(
        "probing_hysteresis_ignored",
        "tf_adabatch/probing.py",
        "(rate_probe > (1.0 + self.hysteresis) * rate_home)",
        "(rate_probe > rate_home)",
        ("tests/test_probing.py",),
        "a probe must beat home by the hysteresis to win (1.03x is not enough at 5 %)",
    ),
    Mutant(
        "probing_lost_probe_keeps_direction",
        "tf_adabatch/probing.py",
        "tf.where(decide, tf.where(better, sign, -sign), self.direction.read_value())",
        "tf.where(decide, sign, self.direction.read_value())",
        ("tests/test_probing.py",),
        "a lost probe turns the search around",
    ),
    Mutant(
        "lr_config_drops_gain_power",
        "tf_adabatch/schedules.py",
        '"gain_power": self.gain_power,',
        '"gain_power": 1.0,',
        ("tests/test_roundtrip_properties.py",),
        "a saved learning-rate rule keeps its non-default gain power",
    ),
    Mutant(
        "lr_config_drops_warmup",
        "tf_adabatch/schedules.py",
        '"warmup_steps": self.warmup_steps,',
        '"warmup_steps": 0,',
        ("tests/test_roundtrip_properties.py",),
        "a saved linear rule keeps its warm-up",
    ),
    # -------------------------------------------- Keras 3.10-3.15 seams (issue 41)
    Mutant(
        "keras_epoch_pairs_passed_as_triples",
        "tf_adabatch/_keras_seams.py",
        "    triples = epoch_items_are_triples()",
        "    triples = True",
        (
            "tests/test_keras_versions.py::test_the_engines_steps_reach_fit_in_the_shape_its_epoch_loop_unpacks",
        ),
        "before Keras 3.11 fit's epoch loop unpacks pairs",
    ),
    Mutant(
        "keras_epoch_pairs_of_the_begin_step",
        "tf_adabatch/_keras_seams.py",
        "            yield end_step, iterator",
        "            yield _, iterator",
        (
            "tests/test_keras_versions.py::test_the_engines_steps_reach_fit_in_the_shape_its_epoch_loop_unpacks",
        ),
        "the pair carries the block's end step",
    ),
    Mutant(
        "keras_activity_sum_not_refused",
        "tf_adabatch/_keras_seams.py",
        "        if regularized:",
        "        if False:",
        (
            "tests/test_keras_versions.py::test_an_activity_regularizer_is_refused_before_any_update_where_keras_sums_it",
        ),
        "where Keras sums activity losses, a model with one is refused",
    ),
    Mutant(
        "keras_activity_probe_inverted",
        "tf_adabatch/_keras_seams.py",
        "    return value == 1.0",
        "    return value == 2.0",
        (
            "tests/test_keras_private.py::test_activity_regularizer_loss_scaling_is_what_the_probe_says",
        ),
        "the probe of Keras's activity-loss scaling",
    ),
    Mutant(
        "keras_lr_hook_not_redirected",
        "tf_adabatch/_keras_seams.py",
        "    if lr_callbacks_redirectable() or optimizer is None:",
        "    if True:",
        (
            "tests/test_keras_versions.py::test_a_plateau_reduces_the_base_rate_where_keras_sets_the_rate_inline",
        ),
        "before 3.15 the learning-rate callbacks see the base rate",
    ),
    Mutant(
        "keras_lr_logs_the_base_rate",
        "tf_adabatch/_keras_seams.py",
        '        logs["learning_rate"] = rate',
        "        pass",
        (
            "tests/test_keras_versions.py::test_a_schedule_sets_the_base_rate_and_the_optimizers_rate_is_logged_where_keras_sets_it_inline",
        ),
        "the logged rate is the optimizer's own",
    ),
    Mutant(
        "keras_lr_users_subclass_hook_not_redirected",
        "tf_adabatch/_keras_seams.py",
        '        attrs["on_epoch_end"] = epoch_end',
        "        pass",
        (
            "tests/test_keras_versions.py::test_a_plateau_reduces_the_base_rate_where_keras_sets_the_rate_inline",
        ),
        "a user's subclass of the callbacks is redirected too",
    ),
    # ------------------------------------- the benchmark and simulation modules (issue 44)
    Mutant(
        "priced_seconds_skips_the_evaluation_step",
        "tf_adabatch/app/benchmarks/efficiency.py",
        "        total += model.step_seconds(batch, devices)\n        at_step[int(step)] = total",
        "        at_step[int(step)] = total\n        total += model.step_seconds(batch, devices)",
        ("tf_adabatch/app/benchmarks/efficiency.py", "tests/test_benchmarks.py"),
        "an evaluation's priced seconds include its own step",
    ),
    Mutant(
        "cluster_compute_ignores_parallel_devices",
        "tf_adabatch/app/simulation/cluster.py",
        "np.asarray(batch, np.float64) / parallel",
        "np.asarray(batch, np.float64) / devices",
        ("tests/test_simulate_cluster.py",),
        "a machine computes at most parallel_devices shares at once",
    ),
]


def copy_repo(dest: Path) -> None:
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache"
    )
    shutil.copytree(ROOT, dest, ignore=ignore)


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[bool, str]:
    """(passed, the first failing test or a reason)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-n",
        "0",
        "-x",
        "-q",
        "-rf",
        "-p",
        "no:randomly",
        *tests,
    ]
    try:
        result = subprocess.run(
            cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return False, f"timeout after {TIMEOUT_S} s"
    if result.returncode == 0:
        return True, ""
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, flags=re.M)
    if failed:
        return False, failed[0]
    return False, f"pytest exit {result.returncode}: {result.stdout[-300:]}"


def apply(copy: Path, mutant: Mutant) -> bool:
    path = copy / mutant.path
    text = path.read_text(encoding="utf-8")
    if text.count(mutant.old) != 1:
        return False
    path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
    return True


def module_table(mutants: list[Mutant], rows: list[tuple[str, str, str]]) -> str:
    """Per module: how many mutants were run and how many were caught.

    >>> m = [Mutant("a", "tf_adabatch/x.py", "o", "n", (), ""),
    ...      Mutant("b", "tf_adabatch/x.py", "o", "n", (), ""),
    ...      Mutant("c", "tf_adabatch/y.py", "o", "n", (), "")]
    >>> print(module_table(m, [("a", "CAUGHT", ""), ("b", "MISSED", ""), ("c", "CAUGHT", "")]))
    <BLANKLINE>
    | module | mutants | caught |
    |---|---|---|
    | tf_adabatch/x.py | 2 | 1 |
    | tf_adabatch/y.py | 1 | 1 |
    | all | 3 | 2 |
    """
    status = {name: state for name, state, _ in rows}
    counts: dict[str, list[int]] = {}
    for m in mutants:
        if m.name in status:
            entry = counts.setdefault(m.path, [0, 0])
            entry[0] += 1
            entry[1] += status[m.name] == "CAUGHT"
    lines = ["", "| module | mutants | caught |", "|---|---|---|"]
    lines += [f"| {path} | {n} | {caught} |" for path, (n, caught) in sorted(counts.items())]
    total = [sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())]
    lines.append(f"| all | {total[0]} | {total[1]} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", action="append", default=[], help="run only this mutant (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    args = parser.parse_args()
    names = {m.name for m in MUTANTS}
    unknown = sorted(set(args.only) - names)
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; see --list")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        bad = 0
        for m in mutants:
            found = (ROOT / m.path).read_text(encoding="utf-8").count(m.old)
            bad += found != 1
            anchor = "anchor ok" if found == 1 else f"ANCHOR FOUND {found} TIMES"
            print(f"{m.name} ({anchor})\n  {m.path}: {m.why}\n  tests: {', '.join(m.tests)}")
        counts: dict[str, int] = {}
        for m in mutants:
            counts[m.path] = counts.get(m.path, 0) + 1
        print("\n| module | mutants |\n|---|---|")
        print("\n".join(f"| {path} | {n} |" for path, n in sorted(counts.items())))
        print(f"| all | {len(mutants)} |")
        return 1 if bad else 0

    start = time.time()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="adabatch-mutation-") as tmp:
        base = Path(tmp) / "baseline"
        copy_repo(base)
        missing = [m.name for m in mutants if (base / m.path).read_text().count(m.old) != 1]
        # The copy's package must win over any installed one (an editable install of the
        # working tree would make every mutant "missed").
        env = dict(os.environ, PYTHONPATH=str(base), TF_CPP_MIN_LOG_LEVEL="3")
        where = subprocess.run(
            [sys.executable, "-c", "import tf_adabatch; print(tf_adabatch.__file__)"],
            cwd=base,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        ).stdout.strip()
        if not where.startswith(str(base)):
            print(f"The copy's tf_adabatch is not the one imported ({where!r}); check PYTHONPATH.")
            return 2
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            ok, detail = run_tests(base, tests)
            print(
                f"baseline ({len(tests)} test targets): {'pass' if ok else 'FAIL ' + detail}",
                flush=True,
            )
            if not ok:
                print("The unmutated copy fails its tests: fix that first.")
                return 2
        for m in mutants:
            t0 = time.time()
            if m.name in missing:
                rows.append((m.name, "NOT APPLIED", f"anchor not found exactly once in {m.path}"))
            else:
                copy = Path(tmp) / m.name
                copy_repo(copy)
                apply(copy, m)
                passed, detail = run_tests(copy, m.tests)
                rows.append((m.name, "MISSED" if passed else "CAUGHT", detail))
                shutil.rmtree(copy, ignore_errors=True)
            print(
                f"{rows[-1][1]:<12} {m.name:<50} {rows[-1][2]}  ({time.time() - t0:.0f} s)",
                flush=True,
            )
    print(f"\n{len(rows)} mutants in {time.time() - start:.0f} s:")
    width = max(len(r[0]) for r in rows)
    for name, status, detail in rows:
        print(f"  {status:<12} {name:<{width}}  {detail}")
    print(module_table(mutants, rows))
    bad = [r for r in rows if r[1] != "CAUGHT"]
    if bad:
        print(f"\n{len(bad)} mutant(s) not caught: {', '.join(r[0] for r in bad)}")
        return 1
    print("\nevery mutant was caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
