package dev.eventspool.android

import android.app.Activity
import android.app.Application
import android.app.job.JobInfo
import android.app.job.JobScheduler
import android.content.ComponentCallbacks2
import android.content.Intent
import android.net.ConnectivityManager
import android.net.NetworkCapabilities
import android.os.Looper
import android.os.PowerManager
import eventspool.CollectorProcess
import eventspool.fastConfig
import eventspool.waitUntil
import java.nio.file.Path
import org.junit.After
import org.junit.Assert.assertEquals
import org.junit.Assert.assertNotNull
import org.junit.Assert.assertTrue
import org.junit.Before
import org.junit.Rule
import org.junit.Test
import org.junit.rules.TemporaryFolder
import org.junit.runner.RunWith
import org.robolectric.Robolectric
import org.robolectric.RobolectricTestRunner
import org.robolectric.RuntimeEnvironment
import org.robolectric.Shadows.shadowOf
import org.robolectric.android.controller.ActivityController
import org.robolectric.shadows.ShadowNetwork
import org.robolectric.shadows.ShadowNetworkCapabilities
import uniffi.eventspool.DeliveryState
import uniffi.eventspool.SpoolConfig

/**
 * The Android integration under Robolectric (Android 14 framework classes), against the real
 * library through JNA and the collector as a separate process.
 */
@RunWith(RobolectricTestRunner::class)
class AndroidIntegrationTest {
    @get:Rule val tmp = TemporaryFolder()
    private lateinit var collector: CollectorProcess
    private lateinit var app: Application
    private val db: Path get() = tmp.root.toPath().resolve("events.db")

    @Before
    fun setUp() {
        app = RuntimeEnvironment.getApplication()
        collector = CollectorProcess(tmp.root.toPath().resolve("collector.db")).start()
    }

    @After
    fun tearDown() {
        EventSpoolAndroid.uninstall()
        collector.stop()
    }

    private fun config(): SpoolConfig = fastConfig(collector.url, db, maxBatchEvents = 50uL)

    private val connectivity get() = app.getSystemService(ConnectivityManager::class.java)
    private val jobs get() = app.getSystemService(JobScheduler::class.java)

    /** What the system tells the default-network callbacks about a network. */
    private fun network(validated: Boolean, metered: Boolean = false) {
        val caps = ShadowNetworkCapabilities.newInstance()
        shadowOf(caps).addTransportType(NetworkCapabilities.TRANSPORT_WIFI)
        shadowOf(caps).addCapability(NetworkCapabilities.NET_CAPABILITY_INTERNET)
        if (validated) shadowOf(caps).addCapability(NetworkCapabilities.NET_CAPABILITY_VALIDATED)
        if (!metered) shadowOf(caps).addCapability(NetworkCapabilities.NET_CAPABILITY_NOT_METERED)
        val callbacks = shadowOf(connectivity).networkCallbacks
        assertTrue("install registers the default-network callback", callbacks.isNotEmpty())
        callbacks.forEach { it.onCapabilitiesChanged(ShadowNetwork.newInstance(7), caps) }
    }

    private fun lost() = shadowOf(connectivity).networkCallbacks.forEach { it.onLost(ShadowNetwork.newInstance(7)) }

    private fun foreground(): ActivityController<Activity> = Robolectric.buildActivity(Activity::class.java).setup()

    private fun background(controller: ActivityController<Activity>) {
        controller.pause().stop()
        assertTrue(EventSpoolAndroid.installation()!!.awaitBackgroundWork(10_000))
    }

    private fun pendingJob(): JobInfo? = jobs.getPendingJob(DeliveryJob.JOB_ID)

    @Test
    fun `going to the background persists and schedules the network-constrained job`() {
        val spool = EventSpoolAndroid.install(app, config())
        val activity = foreground()
        repeat(30) { spool.track("screen", mapOf("i" to it)) }
        assertEquals(0uL, spool.stats().pendingDisk)
        background(activity)
        assertEquals(30uL, spool.core.stats().pendingDisk)
        val job = pendingJob()!!
        assertEquals(JobInfo.NETWORK_TYPE_ANY, job.networkType)
        assertTrue(job.isPersisted)
    }

    @Test
    fun `onTrimMemory UI_HIDDEN persists too`() {
        val spool = EventSpoolAndroid.install(app, config())
        repeat(12) { spool.track("screen", mapOf("i" to it)) }
        spool.stats()
        app.onTrimMemory(ComponentCallbacks2.TRIM_MEMORY_UI_HIDDEN)
        assertTrue(EventSpoolAndroid.installation()!!.awaitBackgroundWork(10_000))
        assertEquals(12uL, spool.core.stats().pendingDisk)
        assertNotNull(pendingJob())
    }

    @Test
    fun `online only with a validated network, offline when it is lost`() {
        val spool = EventSpoolAndroid.install(app, config())
        repeat(20) { spool.track("tap", mapOf("i" to it)) }
        spool.flushBlocking()
        network(validated = false) // connected, but no working internet proven
        assertTrue(spool.state().state is DeliveryState.Offline)
        assertEquals(0L, collector.distinct())

        network(validated = true)
        assertTrue(spool.waitDrainedBlocking(20_000))
        assertEquals(20L, collector.distinct())

        lost()
        assertTrue(waitUntil { spool.state().state is DeliveryState.Offline })
        network(validated = true, metered = true)
        assertTrue(EventSpoolAndroid.installation()!!.conditions.metered)
        assertTrue(waitUntil { spool.state().state !is DeliveryState.Offline })
    }

    @Test
    fun `power save and low battery broadcasts reach the conditions`() {
        EventSpoolAndroid.install(app, config())
        val installation = EventSpoolAndroid.installation()!!
        assertEquals(DeviceConditions(), installation.conditions)
        shadowOf(app.getSystemService(PowerManager::class.java)).setIsPowerSaveMode(true)
        app.sendBroadcast(Intent(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED))
        app.sendBroadcast(Intent(Intent.ACTION_BATTERY_LOW))
        shadowOf(Looper.getMainLooper()).idle()
        assertEquals(DeviceConditions(lowPower = true, batteryLow = true), installation.conditions)
        app.sendBroadcast(Intent(Intent.ACTION_BATTERY_OKAY))
        shadowOf(Looper.getMainLooper()).idle()
        assertEquals(DeviceConditions(lowPower = true, batteryLow = false), installation.conditions)
    }

    @Test
    fun `the job drains, and reschedules after the retry it was told of`() {
        val spool = EventSpoolAndroid.install(app, config())
        network(validated = true)
        repeat(40) { spool.track("job", mapOf("i" to it)) }
        assertEquals(JobNext.Done, DeliveryJob.run(app, budgetMs = 20_000))
        assertEquals(40L, collector.distinct())
        assertEquals(null, pendingJob())

        collector.stop() // outage: the drain ends in a retry countdown or the probe
        repeat(10) { spool.track("job", mapOf("i" to it)) }
        val next = DeliveryJob.run(app, budgetMs = 300)
        assertTrue("$next", next is JobNext.Again)
        assertEquals((next as JobNext.Again).delayMs, pendingJob()!!.minLatencyMillis)
    }

    @Test
    fun `the job service runs the drain on its own thread and finishes`() {
        val spool = EventSpoolAndroid.install(app, config())
        network(validated = true)
        repeat(25) { spool.track("svc", mapOf("i" to it)) }
        val service = Robolectric.buildService(DeliveryJobService::class.java).create().get()
        assertTrue(service.onStartJob(null))
        assertTrue(waitUntil { shadowOf(service).isJobFinished })
        assertEquals(25L, collector.distinct())
    }

    @Test
    fun `the whole story - offline in foreground, validated network, background, killed, the job drains`() {
        var spool = EventSpoolAndroid.install(app, config())
        val activity = foreground()
        val ids = (0 until 300).map { spool.track("story", mapOf("i" to it, "phase" to "first")) }.toMutableList()
        spool.flushBlocking()
        assertTrue(spool.state().state is DeliveryState.Offline)
        assertEquals(0L, collector.distinct())

        network(validated = true)
        assertTrue(spool.waitDrainedBlocking(20_000))
        assertEquals(300L, collector.distinct())

        lost()
        ids += (300 until 500).map { spool.track("story", mapOf("i" to it, "phase" to "second")) }
        background(activity)
        assertEquals(200uL, spool.core.stats().pendingDisk)
        assertNotNull(pendingJob())

        // "Killed": the spool is dropped; a new process opens the same file.
        EventSpoolAndroid.uninstall()
        spool = EventSpoolAndroid.install(app, config())
        assertEquals(200uL, spool.core.stats().restored)
        network(validated = true)
        assertEquals(JobNext.Done, DeliveryJob.run(app, budgetMs = 20_000))
        assertEquals(500, ids.toSet().size)
        assertEquals(500L, collector.distinct()) // no event was re-sent under a new id
    }
}
