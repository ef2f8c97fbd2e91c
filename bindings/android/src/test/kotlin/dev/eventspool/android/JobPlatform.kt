package dev.eventspool.android

import android.app.job.JobInfo
import android.app.job.JobParameters
import android.app.job.JobScheduler
import android.content.Context
import org.robolectric.Robolectric
import org.robolectric.Shadows.shadowOf
import org.robolectric.annotation.Implementation
import org.robolectric.annotation.Implements
import org.robolectric.shadows.ShadowJobScheduler

/**
 * The part of the system's job scheduler that Robolectric leaves out: it starts a pending job
 * (taking it off the pending list, as the system does) and, like the platform, **stops a running
 * job when a job with its id is scheduled** (`JobScheduler.schedule`: "If a job with the given
 * ID is currently running, it will be stopped"), calling the service's `onStopJob`.
 */
object JobPlatform {
    class Running(val id: Int, val service: DeliveryJobService, val params: JobParameters) {
        @Volatile var stoppedBySchedule = 0
        val finished: Boolean get() = shadowOf(service).isJobFinished
    }

    @Volatile var running: Running? = null
        private set

    /** Starts the pending job [id] in a fresh service; returns what `onStartJob` returned and the job. */
    fun start(context: Context, id: Int): Pair<Boolean, Running> {
        val jobs = context.getSystemService(JobScheduler::class.java)
        checkNotNull(jobs.getPendingJob(id)) { "no pending job $id to start" }
        jobs.cancel(id) // the system takes a job off its pending list when it starts it
        val service = Robolectric.buildService(DeliveryJobService::class.java).create().get()
        val job = Running(id, service, parameters(id))
        running = job
        return service.onStartJob(job.params) to job
    }

    /** The system stops the running job (constraints lost, budget over, a schedule of its id). */
    fun stop(job: Running): Boolean = job.service.onStopJob(job.params)

    fun reset() {
        running = null
    }

    internal fun onSchedule(info: JobInfo) {
        val job = running ?: return
        if (job.id == info.id && !job.finished) {
            job.stoppedBySchedule++
            job.service.onStopJob(job.params)
        }
    }

    /** `JobParameters` has no public constructor: the system's own, by reflection, with [id]. */
    private fun parameters(id: Int): JobParameters {
        val constructor = JobParameters::class.java.declaredConstructors
            .first { it.parameterTypes.firstOrNull() == android.os.IBinder::class.java }
        var idSet = false
        val args: List<Any?> = constructor.parameterTypes.map { type ->
            when (type) {
                Int::class.javaPrimitiveType -> if (!idSet) { idSet = true; id } else 0
                Boolean::class.javaPrimitiveType -> false
                else -> null
            }
        }
        constructor.isAccessible = true
        return constructor.newInstance(*args.toTypedArray<Any?>()) as JobParameters
    }
}

/** Robolectric's job scheduler with the platform's stop-on-schedule rule ([JobPlatform]). */
@Implements(className = "android.app.JobSchedulerImpl", isInAndroidSdk = false)
class PlatformJobScheduler : ShadowJobScheduler.ShadowJobSchedulerImpl() {
    @Implementation
    override fun schedule(job: JobInfo): Int {
        JobPlatform.onSchedule(job)
        return super.schedule(job)
    }
}
