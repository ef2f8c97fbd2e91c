package dev.eventspool.android

import dev.eventspool.Spool
import uniffi.eventspool.DeliveryConditions
import uniffi.eventspool.DrainOutcome
import uniffi.eventspool.SpoolConfig

/**
 * The two calls of the Android layer into the core's platform-scheduler API, in one place:
 * the bounded drain a job runs, and the device conditions.
 */
internal object CoreBridge {
    /** The core's `attempt_timeout_ms` default (docs/configuration.md), for a config that leaves it unset. */
    const val DEFAULT_ATTEMPT_TIMEOUT_MS = 10_000L

    fun attemptTimeoutMs(config: SpoolConfig): Long = config.attemptTimeoutMs?.toLong() ?: DEFAULT_ATTEMPT_TIMEOUT_MS

    /**
     * Runs the core's bounded drain inside a platform budget of [budgetMs] and says what the job
     * does next. A request in flight when the drain's own budget ends is waited for (its answer
     * decides whether its events go again), up to [attemptTimeoutMs]: the drain gets the platform
     * budget minus that, so the job ends inside what the OS granted.
     *
     * The drain runs in slices of [DeliveryJob.SLICE_MS], and a retry due inside the budget is
     * waited for on [stop]: `onStopJob` ends the job within a slice (the worker keeps the events
     * and goes on by itself while the process lives).
     */
    fun drain(spool: Spool, budgetMs: Long, attemptTimeoutMs: Long, stop: JobStop): JobNext {
        val deadline = System.nanoTime() / 1_000_000 + (budgetMs - attemptTimeoutMs).coerceAtLeast(0)
        while (true) {
            if (stop.stopped) return JobNext.Stopped
            val left = deadline - System.nanoTime() / 1_000_000
            val slice = left.coerceIn(0, DeliveryJob.SLICE_MS)
            when (val outcome = spool.deliverWithinBlocking(slice)) {
                is DrainOutcome.Drained -> return JobNext.Done
                is DrainOutcome.Blocked -> return JobNext.Blocked(outcome.status)
                is DrainOutcome.DeadlineReached -> if (left <= DeliveryJob.SLICE_MS) return JobNext.Again(DeliveryJob.AGAIN_SOON_MS)
                is DrainOutcome.RetryAfter -> {
                    val ms = outcome.ms.toLong()
                    // Past this job's budget: the successor waits for it.
                    if (ms >= left) return JobNext.Again(ms)
                    // Inside the budget: the worker retries on its own timer; wait for it, or for a stop.
                    if (stop.sleep(ms)) return JobNext.Stopped
                }
            }
        }
    }

    /** Hands the device's conditions to the core, whose `deliver_on_*` policy decides (state `Deferred(reason)`). */
    fun applyConditions(spool: Spool, conditions: DeviceConditions) {
        spool.setConditions(DeliveryConditions(metered = conditions.metered, lowPower = conditions.lowPower, batteryLow = conditions.batteryLow))
    }
}
