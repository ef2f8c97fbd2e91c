package dev.eventspool.android

import android.app.job.JobInfo
import android.app.job.JobParameters
import android.app.job.JobScheduler
import android.app.job.JobService
import android.content.ComponentName
import android.content.Context
import android.os.Build
import dev.eventspool.Spool
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
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
    /** The platform stopped the job (`onStopJob`): it reschedules the job itself. */
    object Stopped : JobNext()
}

/** Set by `onStopJob`; the drain looks at it between slices and while it waits for a retry. */
class JobStop {
    private val latch = CountDownLatch(1)
    val stopped: Boolean get() = latch.count == 0L

    fun stop() = latch.countDown()

    /** Sleeps up to [ms]; true when the stop came first. */
    fun sleep(ms: Long): Boolean = latch.await(ms.coerceAtLeast(0), TimeUnit.MILLISECONDS)

    companion object {
        val NEVER = JobStop()
    }
}

/**
 * Background delivery through JobScheduler: a network constraint (the OS starts it only with a
 * network; an unmetered one under `deliverOnMetered = false`, a battery that is not low under
 * `deliverOnBatteryLow = false`), persisted across reboots. The job drains within [budgetMs]
 * (well under the OS's limit, which stops a job after about 10 minutes) in slices, so that
 * `onStopJob` ends it within a slice, and schedules its successor from what the drain returned.
 *
 * Two job ids, because scheduling the id of a running job makes the platform stop that job: a
 * running job's successor takes the other id, and a drain asked for while a job runs (a network
 * that came back, a condition that cleared, the app going to the background) is left to the
 * running job, which schedules a successor at once when it ends with events pending.
 */
object DeliveryJob {
    const val JOB_ID = 0x45565350 // "EVSP"
    /** The id of a running [JOB_ID] job's successor (and the reverse). */
    const val SUCCESSOR_JOB_ID = JOB_ID + 1
    /** How long one job drains at most. */
    @JvmField var budgetMs: Long = 60_000
    /** The delay of the job after a budget that ran out with events pending. */
    const val AGAIN_SOON_MS = 1_000L
    /** The drain looks for a stop at least this often (plus the answer of a request in flight). */
    const val SLICE_MS = 1_000L
    /** False: no job is scheduled at all (an app that drains from its own code and needs no restarts). */
    @JvmField @Volatile var enabled: Boolean = true

    /**
     * For an app with its own scheduler (WorkManager): called instead of JobScheduler with the
     * delay of the next drain, whenever this layer would schedule its job (background, a
     * validated network or cleared conditions with events pending, a `RetryAfter`).
     */
    @JvmField @Volatile var scheduler: ((context: Context, delayMs: Long) -> Unit)? = null

    /** The job this process runs now, if any: what is scheduled meanwhile must not take its id. */
    internal class Running(val id: Int) {
        @Volatile var drainWanted = false
    }

    @Volatile private var running: Running? = null

    /**
     * The bounded drain alone, for an app's own worker: what to do next, nothing scheduled.
     * [budgetMs] is the platform's budget; the core's drain gets it minus [attemptTimeoutMs]
     * (the installed config's `attemptTimeoutMs`), the most a request in flight can add.
     */
    @JvmStatic
    @JvmOverloads
    fun drain(
        spool: Spool,
        budgetMs: Long = this.budgetMs,
        attemptTimeoutMs: Long = EventSpoolAndroid.installationOrNull()?.attemptTimeoutMs ?: CoreBridge.DEFAULT_ATTEMPT_TIMEOUT_MS,
        stop: JobStop = JobStop.NEVER,
    ): JobNext = CoreBridge.drain(spool, budgetMs, attemptTimeoutMs, stop)

    /**
     * Asks for a drain in [delayMs]. While a job runs in this process the running job takes the
     * request (scheduling its id would stop it); otherwise the job is scheduled, under the
     * installed config's constraints.
     */
    @JvmStatic
    fun schedule(context: Context, delayMs: Long) {
        if (!enabled) return
        running?.let {
            it.drainWanted = true
            return
        }
        submit(context, JOB_ID, delayMs)
    }

    private fun submit(context: Context, id: Int, delayMs: Long) {
        scheduler?.let { return it(context, delayMs.coerceAtLeast(0)) }
        val config = EventSpoolAndroid.installationOrNull()?.config
        val info = JobInfo.Builder(id, ComponentName(context, DeliveryJobService::class.java))
            .setRequiredNetworkType(if (config?.deliverOnMetered == false) JobInfo.NETWORK_TYPE_UNMETERED else JobInfo.NETWORK_TYPE_ANY)
            .setMinimumLatency(delayMs.coerceAtLeast(0))
            .setPersisted(true)
            .apply {
                // deliverOnLowPower has no job constraint: the core defers while power saving lasts.
                if (config?.deliverOnBatteryLow == false && Build.VERSION.SDK_INT >= Build.VERSION_CODES.O) setRequiresBatteryNotLow(true)
            }
            .build()
        runCatching {
            val jobs = context.getSystemService(JobScheduler::class.java)
            jobs.schedule(info)
            // One pending drain at a time: the other id's job, if pending, would only find less to do.
            val other = if (id == JOB_ID) SUCCESSOR_JOB_ID else JOB_ID
            if (running?.id != other) jobs.cancel(other)
        }.onFailure { EventSpoolAndroid.log("eventspool: the delivery job could not be scheduled: $it", it) }
    }

    /** One job's work: drain, then schedule the next job when a timer is what it waits for. */
    @JvmStatic
    @JvmOverloads
    fun run(context: Context, budgetMs: Long = this.budgetMs, stop: JobStop = JobStop.NEVER): JobNext =
        runAs(context, null, budgetMs, stop, EventSpoolAndroid.spool)

    /**
     * Registers the platform's job [jobId] as the one this process runs, from `onStartJob` on,
     * before its thread starts: a drain asked for from then on (a network callback) goes to that
     * job instead of scheduling its id, which would make the platform stop it.
     */
    internal fun starting(jobId: Int): Running = Running(jobId).also { running = it }

    /** Lets go of a job registered by [starting] whose thread never ran. */
    internal fun notStarted(job: Running) {
        if (running === job) running = null
    }

    /** The drain of a platform job registered by [starting] ([job]), or of an app's own call (null). */
    internal fun runAs(context: Context, job: Running?, budgetMs: Long, stop: JobStop, spool: Spool): JobNext {
        val me = job ?: Running(-1)
        val jobId = job?.id
        try {
            val next = drain(spool, budgetMs, stop = stop)
            val successor = if (jobId == JOB_ID) SUCCESSOR_JOB_ID else JOB_ID
            when (next) {
                is JobNext.Done -> {}
                is JobNext.Again -> submit(context, successor, if (me.drainWanted) 0 else next.delayMs)
                // No job: the network constraint would start one on any network, unvalidated ones
                // too, and it would end Blocked again, a loop. The installation's callbacks schedule
                // the job when the network is validated or the conditions allow delivery; one that
                // came while this job ran is honoured now.
                is JobNext.Blocked -> if (me.drainWanted && spool.state().pending > 0uL) submit(context, successor, 0)
                // The platform reschedules a stopped job itself (onStopJob returned true).
                is JobNext.Stopped -> {}
            }
            return next
        } finally {
            if (running === me) running = null
        }
    }
}

/** Declared in the library's AndroidManifest.xml (BIND_JOB_SERVICE). */
class DeliveryJobService : JobService() {
    @Volatile private var stop: JobStop? = null

    override fun onStartJob(params: JobParameters?): Boolean {
        val stop = JobStop().also { this.stop = it }
        // The process may be new (the app was killed) and the app may install only later: the
        // job opens the spool itself from the app's EventSpoolAndroid.ConfigProvider.
        val spool = EventSpoolAndroid.spoolOrNull() ?: EventSpoolAndroid.installFromProvider(application) ?: return false
        val job = DeliveryJob.starting(params?.jobId ?: DeliveryJob.JOB_ID)
        val thread = Thread({
            try {
                runCatching { DeliveryJob.runAs(applicationContext, job, DeliveryJob.budgetMs, stop, spool) }
                    .onFailure { EventSpoolAndroid.log("eventspool: the delivery job failed: $it", it) }
            } finally {
                // After onStopJob the platform has let go of the job: nothing to finish.
                if (!stop.stopped) runCatching { jobFinished(params, false) }
            }
        }, "eventspool-job").apply { isDaemon = true }
        try {
            thread.start()
        } catch (e: Throwable) {
            DeliveryJob.notStarted(job)
            EventSpoolAndroid.log("eventspool: the delivery job's thread did not start: $e", e)
            return false
        }
        return true
    }

    /** The OS ends the job early (constraints lost, budget over): the drain stops within a slice; every event stays, and the job runs again. */
    override fun onStopJob(params: JobParameters?): Boolean {
        stop?.stop()
        return true
    }
}
