package dev.eventspool.android

import android.app.job.JobInfo
import android.app.job.JobParameters
import android.app.job.JobScheduler
import android.app.job.JobService
import android.content.ComponentName
import android.content.Context

/** What a delivery job does after its drain. */
sealed class JobNext {
    /** Nothing pending: no new job. */
    object Done : JobNext()
    /** Run again in [delayMs] (the budget ran out, or the next retry is due then). */
    data class Again(val delayMs: Long) : JobNext()
    /** Blocked (offline, paused, deferred, disabled): a new job waits for a network, not a timer. */
    data class Blocked(val why: String) : JobNext()
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
    /** False for an app that runs [drain] from its own scheduler (WorkManager): no job is scheduled then. */
    @JvmField @Volatile var enabled: Boolean = true

    /** The bounded drain alone, for an app's own worker: what to do next, nothing scheduled. */
    @JvmStatic
    fun drain(spool: dev.eventspool.Spool, budgetMs: Long = this.budgetMs): JobNext = CoreBridge.drain(spool, budgetMs)

    @JvmStatic
    fun schedule(context: Context, delayMs: Long) {
        if (!enabled) return
        val info = JobInfo.Builder(JOB_ID, ComponentName(context, DeliveryJobService::class.java))
            .setRequiredNetworkType(JobInfo.NETWORK_TYPE_ANY)
            .setMinimumLatency(delayMs.coerceAtLeast(0))
            .setPersisted(true)
            .build()
        context.getSystemService(JobScheduler::class.java).schedule(info)
    }

    /** One job's work: drain, then schedule the next job when one is needed. */
    @JvmStatic
    fun run(context: Context, budgetMs: Long = this.budgetMs): JobNext {
        val spool = EventSpoolAndroid.spool
        val next = CoreBridge.drain(spool, budgetMs)
        when (next) {
            is JobNext.Done -> {}
            is JobNext.Again -> schedule(context, next.delayMs)
            // The network constraint starts it once there is a network again.
            is JobNext.Blocked -> schedule(context, 0)
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
