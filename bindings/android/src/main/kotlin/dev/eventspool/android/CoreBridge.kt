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
    /** The core's `attempt_timeout_ms` default (README configuration table), for a config that leaves it unset. */
    const val DEFAULT_ATTEMPT_TIMEOUT_MS = 10_000L

    fun attemptTimeoutMs(config: SpoolConfig): Long = config.attemptTimeoutMs?.toLong() ?: DEFAULT_ATTEMPT_TIMEOUT_MS

    /**
     * Runs the core's bounded drain inside a platform budget of [budgetMs] and says what the job
     * does next. A request in flight when the drain's own budget ends is waited for (its answer
     * decides whether its events go again), up to [attemptTimeoutMs]: the drain gets the platform
     * budget minus that, so the job ends inside what the OS granted.
     */
    fun drain(spool: Spool, budgetMs: Long, attemptTimeoutMs: Long): JobNext =
        when (val outcome = spool.deliverWithinBlocking((budgetMs - attemptTimeoutMs).coerceAtLeast(0))) {
            is DrainOutcome.Drained -> JobNext.Done
            is DrainOutcome.DeadlineReached -> JobNext.Again(DeliveryJob.AGAIN_SOON_MS)
            is DrainOutcome.RetryAfter -> JobNext.Again(outcome.ms.toLong())
            is DrainOutcome.Blocked -> JobNext.Blocked(outcome.status)
        }

    /** Hands the device's conditions to the core, whose `deliver_on_*` policy decides (state `Deferred(reason)`). */
    fun applyConditions(spool: Spool, conditions: DeviceConditions) {
        spool.setConditions(DeliveryConditions(metered = conditions.metered, lowPower = conditions.lowPower, batteryLow = conditions.batteryLow))
    }
}
