package dev.eventspool.android

import android.app.job.JobInfo
import android.content.ComponentCallbacks2
import android.content.Intent
import android.os.Looper
import android.os.PowerManager
import eventspool.waitUntil
import java.time.Duration
import org.junit.After
import org.junit.Assert.assertEquals
import org.junit.Assert.assertNotNull
import org.junit.Assert.assertTrue
import org.junit.Test
import org.junit.runner.RunWith
import org.robolectric.RobolectricTestRunner
import org.robolectric.Shadows.shadowOf
import org.robolectric.annotation.Config

/** The delivery job as the platform runs it: started, stopped, rescheduled (JobPlatform). */
@RunWith(RobolectricTestRunner::class)
@Config(shadows = [PlatformJobScheduler::class])
class JobSchedulingTest : AndroidTestBase() {
    @After
    fun resetPlatform() = JobPlatform.reset()

    private fun jobThreadAlive() = Thread.getAllStackTraces().keys.any { it.name == "eventspool-job" && it.isAlive }

    private fun anyPendingJob(): JobInfo? = jobs.allPendingJobs.firstOrNull()

    /**
     * A job started over ten pending events against a collector that answers 503 with a 30 s
     * `Retry-After`: its drain waits for the retry inside its budget, so the job keeps running.
     */
    private fun startWaitingJob(): JobPlatform.Running {
        scriptedCollector("503:30")
        val spool = EventSpoolAndroid.install(app, config())
        network(validated = true)
        repeat(10) { spool.track("job", mapOf("i" to it)) }
        spool.flushBlocking()
        val pending = anyPendingJob() ?: run { DeliveryJob.schedule(app, 0); anyPendingJob()!! }
        val (started, job) = JobPlatform.start(app, pending.id)
        assertTrue(started)
        return job
    }

    @Test
    fun `a running job is not stopped by the successor it schedules`() {
        val spool = EventSpoolAndroid.install(app, config())
        network(validated = true)
        collector.stop() // outage: the drain ends with a retry to come, so the job needs a successor
        repeat(10) { spool.track("job", mapOf("i" to it)) }
        spool.flushBlocking()
        DeliveryJob.budgetMs = 2_300
        try {
            val pending = anyPendingJob() ?: run { DeliveryJob.schedule(app, 0); anyPendingJob()!! }
            val (started, job) = JobPlatform.start(app, pending.id)
            assertTrue(started)
            assertTrue("the job finished", waitUntil(20_000) { job.finished })
            assertEquals("the job's own successor stopped it", 0, job.stoppedBySchedule)
            assertNotNull("a successor is pending", anyPendingJob())
        } finally {
            DeliveryJob.budgetMs = 60_000
        }
    }

    @Test
    fun `onStopJob stops the drain`() {
        val job = startWaitingJob()
        assertTrue(waitUntil { collector.requests() >= 1L })
        assertTrue("the drain is running", jobThreadAlive())
        JobPlatform.stop(job)
        assertTrue("the drain went on after onStopJob", waitUntil(3_000) { !jobThreadAlive() })
    }

    @Test
    fun `the network, power and trim callbacks do not stop a running job`() {
        val job = startWaitingJob()
        assertTrue(waitUntil { collector.requests() >= 1L })

        lost()
        network(validated = true) // a validated network again
        shadowOf(app.getSystemService(PowerManager::class.java)).setIsPowerSaveMode(true)
        app.sendBroadcast(Intent(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED))
        shadowOf(app.getSystemService(PowerManager::class.java)).setIsPowerSaveMode(false)
        app.sendBroadcast(Intent(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED))
        app.onTrimMemory(ComponentCallbacks2.TRIM_MEMORY_UI_HIDDEN)
        shadowOf(Looper.getMainLooper()).idleFor(Duration.ofSeconds(2))
        EventSpoolAndroid.installation()!!.awaitBackgroundWork(10_000)
        assertEquals("a callback scheduled the running job's id", 0, job.stoppedBySchedule)
        JobPlatform.stop(job)
    }

    @Test
    fun `a drain asked for as the job starts goes to that job, never stops it`() {
        val job = startWaitingJob()
        // At once, before the job's thread has had a chance to run: a network callback asking for
        // a drain must find the job already registered as running.
        DeliveryJob.schedule(app, 0)
        assertEquals("a drain asked for as the job started scheduled its id", 0, job.stoppedBySchedule)
        assertTrue(waitUntil { collector.requests() >= 1L })
        JobPlatform.stop(job)
        assertTrue("the drain went on after onStopJob", waitUntil(3_000) { !jobThreadAlive() })
    }

    @Test
    fun `the deliverOn settings are the job's constraints`() {
        val spool = EventSpoolAndroid.install(app, config().apply { deliverOnMetered = false; deliverOnBatteryLow = false })
        repeat(3) { spool.track("constrained", mapOf("i" to it)) }
        DeliveryJob.schedule(app, 0)
        val job = assertNotNull(anyPendingJob()).let { anyPendingJob()!! }
        assertEquals("deliverOnMetered = false: an unmetered network", JobInfo.NETWORK_TYPE_UNMETERED, job.networkType)
        // The constraint exists from API 26; below it the core's Deferred(battery_low) is what holds.
        if (android.os.Build.VERSION.SDK_INT >= 26) assertTrue("deliverOnBatteryLow = false: battery not low", job.isRequireBatteryNotLow)
    }
}
