package dev.eventspool.android

import dev.eventspool.Spool
import uniffi.eventspool.DeliveryState

/**
 * The two calls of the Android layer into the core's platform-scheduler API, in one place:
 * the bounded drain a job runs, and the device conditions.
 */
internal object CoreBridge {
    /**
     * Runs delivery for at most [budgetMs] and says what the job does next. Hands over what
     * `track()` accepted, flushes, and waits for the drain; when it did not drain, the state
     * says why: a retry countdown → again after it, offline / paused / disabled → blocked.
     */
    fun drain(spool: Spool, budgetMs: Long): JobNext {
        spool.flushBlocking()
        if (spool.waitDrainedBlocking(budgetMs)) return JobNext.Done
        return when (val s = spool.state().state) {
            is DeliveryState.RetryScheduled -> JobNext.Again(s.retryInMs.toLong())
            is DeliveryState.WaitingForUser -> JobNext.Again(s.probeInMs.toLong())
            is DeliveryState.Offline, is DeliveryState.Paused, is DeliveryState.Disabled -> JobNext.Blocked(s.toString())
            else -> JobNext.Again(DeliveryJob.AGAIN_SOON_MS)
        }
    }

    /** Hands the device's conditions to the core, whose `deliver_on_*` policy decides. */
    @Suppress("UNUSED_PARAMETER")
    fun applyConditions(spool: Spool, conditions: DeviceConditions) {
        // Not enforced yet: the core's set_conditions (issue 13, point 2) is not on this branch's
        // base. Until it is, the conditions are only kept in Installation.conditions.
    }
}
