package dev.eventspool.android

import android.app.job.JobInfo
import android.app.job.JobParameters
import android.app.job.JobScheduler
import android.app.job.JobService
import android.content.ComponentName
import android.content.Context
import uniffi.eventspool.DeliveryStatus

/** What a delivery job does after its drain. */
sealed class JobNext {
    /** Nothing pending: no new job. */
    object Done : JobNext()
    /** Run again in [delayMs] (the budget ran out, or the next retry is due then). */
    data class Again(val delayMs: Long) : JobNext()
    /**
     * Blocked (offline, paused, disabled, deferred; [status] says which): no timer, the change
     * restarts delivery. A validated network or conditions that allow delivery again schedule
     * the job from the installation's callbacks; a paused or disabled spool waits for the app.
     */
    data class Blocked(val status: DeliveryStatus) : JobNext()
}

/**
 * Background delivery through JobScheduler: one job id, a network constraint (the OS starts it
 * only with a network), persisted across reboots. The job drains within [BUDGET_MS] (well under
 * the OS's limit, which stops a job after about 10 minutes) and schedules its successor from
 * what the drain returned.
 */
object DeliveryJob {
    const val JOB_ID = 0x45565350 // "EVSP"
    /** How long one job drains at most. */
    @JvmField var budgetMs: Long = 60_000
    /** The delay of the job after a budget that ran out with events pending. */
    const val AGAIN_SOON_MS = 1_000L
    /** False: no job is scheduled at all (an app that drains from its own code and needs no restarts). */
    @JvmField @Volatile var enabled: Boolean = true

    /**
     * For an app with its own scheduler (WorkManager): called instead of JobScheduler with the
     * delay of the next drain, whenever this layer would schedule its job (background, a
     * validated network or cleared conditions with events pending, a `RetryAfter`).
     */
    @JvmField @Volatile var scheduler: ((context: Context, delayMs: Long) -> Unit)? = null

    /**
     * The bounded drain alone, for an app's own worker: what to do next, nothing scheduled.
     * [budgetMs] is the platform's budget; the core's drain gets it minus [attemptTimeoutMs]
     * (the installed config's `attemptTimeoutMs`), the most a request in flight can add.
     */
    @JvmStatic
    @JvmOverloads
    fun drain(
        spool: dev.eventspool.Spool,
        budgetMs: Long = this.budgetMs,
        attemptTimeoutMs: Long = EventSpoolAndroid.installationOrNull()?.attemptTimeoutMs ?: CoreBridge.DEFAULT_ATTEMPT_TIMEOUT_MS,
    ): JobNext = CoreBridge.drain(spool, budgetMs, attemptTimeoutMs)

    @JvmStatic
    fun schedule(context: Context, delayMs: Long) {
        if (!enabled) return
        scheduler?.let { return it(context, delayMs.coerceAtLeast(0)) }
        val info = JobInfo.Builder(JOB_ID, ComponentName(context, DeliveryJobService::class.java))
            .setRequiredNetworkType(JobInfo.NETWORK_TYPE_ANY)
            .setMinimumLatency(delayMs.coerceAtLeast(0))
            .setPersisted(true)
            .build()
        context.getSystemService(JobScheduler::class.java).schedule(info)
    }

    /** One job's work: drain, then schedule the next job when a timer is what it waits for. */
    @JvmStatic
    fun run(context: Context, budgetMs: Long = this.budgetMs): JobNext {
        val next = drain(EventSpoolAndroid.spool, budgetMs)
        when (next) {
            is JobNext.Done -> {}
            is JobNext.Again -> schedule(context, next.delayMs)
            // No job: the network constraint would start one on any network, unvalidated ones
            // too, and it would end Blocked again, a loop. The installation's callbacks schedule
            // the job when the network is validated or the conditions allow delivery.
            is JobNext.Blocked -> {}
        }
        return next
    }
}

/** Declared in the library's AndroidManifest.xml (BIND_JOB_SERVICE). */
class DeliveryJobService : JobService() {
    @Volatile private var worker: Thread? = null

    override fun onStartJob(params: JobParameters?): Boolean {
        // The process may be new (the app was killed): Application.onCreate ran install() first.
        if (EventSpoolAndroid.installationOrNull() == null) return false
        worker = Thread({
            runCatching { DeliveryJob.run(applicationContext) }
            jobFinished(params, false)
        }, "eventspool-job").apply { start() }
        return true
    }

    /** The OS ends the job early (network lost, budget over): the spool keeps every event; run again later. */
    override fun onStopJob(params: JobParameters?): Boolean = true
}
