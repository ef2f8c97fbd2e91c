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
import java.nio.file.Files
import java.nio.file.Path
import java.nio.file.StandardCopyOption
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
import uniffi.eventspool.DeferReason
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
        DeliveryJob.scheduler = null
        EventSpoolAndroid.uninstall()
        collector.stop()
    }

    private fun config(): SpoolConfig = fastConfig(collector.url, db, maxBatchEvents = 50uL)

    /** Broadcasts the device's power-save mode, as the system does when the user toggles it. */
    private fun powerSave(on: Boolean) {
        shadowOf(app.getSystemService(PowerManager::class.java)).setIsPowerSaveMode(on)
        app.sendBroadcast(Intent(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED))
        shadowOf(Looper.getMainLooper()).idle()
    }

    private fun battery(low: Boolean) {
        app.sendBroadcast(Intent(if (low) Intent.ACTION_BATTERY_LOW else Intent.ACTION_BATTERY_OKAY))
        shadowOf(Looper.getMainLooper()).idle()
    }

    /**
     * A device condition the config does not deliver under: [forbid] makes the state
     * `Deferred(reason)` and nothing reaches the collector, even when a job drains (its
     * `Blocked` outcome is the point where the worker has seen the flush); [allow] clears it and
     * everything is delivered.
     */
    private fun deferredThenDelivered(config: SpoolConfig, reason: DeferReason, forbid: () -> Unit, allow: () -> Unit) {
        val spool = EventSpoolAndroid.install(app, config)
        forbid()
        network(validated = true, metered = reason == DeferReason.METERED)
        repeat(20) { spool.track("deferred", mapOf("i" to it)) }
        spool.flushBlocking()
        assertTrue("${spool.state()}", waitUntil { spool.state().state == DeliveryState.Deferred(reason) })
        val next = DeliveryJob.run(app, budgetMs = 5_000)
        assertTrue("$next", next is JobNext.Blocked)
        assertEquals(DeliveryState.Deferred(reason), spool.state().state)
        assertEquals("no request while deferred", 0L, collector.requests())

        allow()
        assertTrue(spool.waitDrainedBlocking(20_000))
        assertEquals(20L, collector.distinct())
        assertTrue("${spool.state()}", spool.state().state !is DeliveryState.Deferred)
    }

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
        // Past the debounce that tells a trip to the background from a configuration change.
        shadowOf(Looper.getMainLooper()).idleFor(java.time.Duration.ofMillis(Installation.BACKGROUND_DEBOUNCE_MS))
        assertTrue(EventSpoolAndroid.installation()!!.awaitBackgroundWork(10_000))
    }

    private fun pendingJob(): JobInfo? = jobs.getPendingJob(DeliveryJob.JOB_ID)

    @Test
    fun `going to the background persists and schedules the network-constrained job`() {
        // durability = spill: the events wait in memory until the background persists them
        // (the layer's default, always, has them on disk already).
        val spool = EventSpoolAndroid.install(app, config().apply { durability = "spill" })
        val activity = foreground()
        repeat(30) { spool.track("screen", mapOf("i" to it)) }
        assertEquals(0uL, spool.statsBlocking().pendingDisk)
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
        spool.statsBlocking()
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
    fun `a metered network defers delivery under deliverOnMetered=false, an unmetered one delivers`() {
        val config = config().apply { deliverOnMetered = false }
        deferredThenDelivered(config, DeferReason.METERED, forbid = {}, allow = { network(validated = true, metered = false) })
    }

    @Test
    fun `power-save mode defers delivery, leaving it delivers`() =
        deferredThenDelivered(config(), DeferReason.LOW_POWER, forbid = { powerSave(true) }, allow = { powerSave(false) })

    @Test
    fun `a low battery defers delivery, battery okay delivers`() =
        deferredThenDelivered(config(), DeferReason.BATTERY_LOW, forbid = { battery(low = true) }, allow = { battery(low = false) })

    @Test
    fun `the job reschedules at the collector's Retry-After, then finishes on Drained`() {
        collector.stop()
        collector = CollectorProcess(tmp.root.toPath().resolve("collector-503.db"), script = listOf("503:1")).start()
        // The drain gets the platform budget minus attempt_timeout_ms: 800 - 500 = 300 ms.
        val spool = EventSpoolAndroid.install(app, config().apply { attemptTimeoutMs = 500uL })
        repeat(10) { spool.track("job", mapOf("i" to it)) }
        // Every event reaches the core before the network does, so the first request carries
        // all ten: tracked after it, the layer's hand-off could split them over two requests.
        assertEquals(10uL, spool.statsBlocking().pendingMemory + spool.statsBlocking().pendingDisk)
        network(validated = true)
        val next = DeliveryJob.run(app, budgetMs = 800)
        assertTrue("$next", next is JobNext.Again)
        val delay = (next as JobNext.Again).delayMs
        // Retry-After: 1 puts the retry ~1000 ms after the 503, past the 300 ms drain.
        assertTrue("delay $delay", delay in 301..1_000)
        assertEquals(delay, pendingJob()!!.minLatencyMillis)
        assertEquals(1L, collector.requests())
        assertEquals(0L, collector.distinct())

        jobs.cancel(DeliveryJob.JOB_ID) // the scheduler takes a job off its list when it starts it
        assertEquals(JobNext.Done, DeliveryJob.run(app, budgetMs = 20_000)) // waits for the retry inside its budget
        assertEquals(2L, collector.requests())
        assertEquals(10L, collector.distinct())
        assertEquals("Drained schedules no successor", null, pendingJob())
    }

    @Test
    fun `Blocked offline schedules no job, the validated network does`() {
        val spool = EventSpoolAndroid.install(app, config())
        repeat(5) { spool.track("offline", mapOf("i" to it)) }
        val next = DeliveryJob.run(app, budgetMs = 3_000)
        assertTrue("$next", next is JobNext.Blocked)
        assertTrue(spool.state().state is DeliveryState.Offline)
        assertEquals("no timer loop while offline", null, pendingJob())
        assertEquals(0L, collector.requests())

        network(validated = true)
        assertNotNull("the network callback starts the job", pendingJob())
        assertEquals(JobNext.Done, DeliveryJob.run(app, budgetMs = 20_000))
        assertEquals(5L, collector.distinct())
    }

    @Test
    fun `an app's own scheduler gets every restart instead of JobScheduler`() {
        val asked = java.util.concurrent.CopyOnWriteArrayList<Long>()
        DeliveryJob.scheduler = { _, delayMs -> asked += delayMs }
        val spool = EventSpoolAndroid.install(app, config())
        repeat(5) { spool.track("own", mapOf("i" to it)) }
        assertTrue(DeliveryJob.drain(spool, budgetMs = 3_000) is JobNext.Blocked)
        network(validated = true)
        assertEquals("the validated network asks for a drain now", listOf(0L), asked)
        assertEquals(JobNext.Done, DeliveryJob.drain(spool, budgetMs = 20_000))
        assertEquals(5L, collector.distinct())
        assertEquals("nothing went to JobScheduler", null, pendingJob())
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
        val next = DeliveryJob.run(app, budgetMs = 2_300) // a 300 ms drain (minus attempt_timeout_ms)
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

    /**
     * What a killed process leaves: the store's files as they are on disk now. [restoreDiskImage]
     * puts them back, so that a shutdown in between (the old handle must release the store's
     * lock) leaves no trace: no final persist reaches the reopened file.
     */
    private fun diskImage(): Map<Path, ByteArray> =
        Files.list(tmp.root.toPath()).use { files ->
            files.filter { it.fileName.toString().startsWith("events.db") && !it.fileName.toString().endsWith(".lock") }
                .toList().associateWith { Files.readAllBytes(it) }
        }

    private fun restoreDiskImage(image: Map<Path, ByteArray>) {
        Files.list(tmp.root.toPath()).use { files ->
            files.filter { it.fileName.toString().startsWith("events.db") && !it.fileName.toString().endsWith(".lock") }
                .toList().forEach { Files.delete(it) }
        }
        image.forEach { (path, bytes) -> Files.write(path, bytes) }
    }

    /**
     * The mobile story end to end: foreground, network, background, killed, job.
     * Where the 500 events are:
     * - all 500 are tracked in the foreground while offline (none reaches the collector);
     * - the validated network appears: the collector takes the first 6 batches of 50 (300 events)
     *   and answers the 7th with 503, Retry-After 3600: longer than the SDK retries on its own,
     *   so it waits for the slow probe (`WaitingForUser`) and 200 are still pending when the app
     *   goes to the background;
     * - background: those 200 are persisted, and a job is scheduled;
     * - the network goes away and the process is "killed": the store's files are taken as they are
     *   on disk at that moment (no shutdown, no final persist), the old handle is released and
     *   the files are put back exactly as taken;
     * - a new process opens the same file: the 200 come back from disk; the validated network
     *   schedules the job; the job's bounded drain delivers them and ends on Drained;
     * - the collector holds 500 distinct ids, the 500 tracked ones (nothing re-sent under a new id).
     */
    @Test
    fun `the whole story - 500 offline in foreground, validated network, background, killed, the job drains`() {
        collector.stop()
        collector = CollectorProcess(tmp.root.toPath().resolve("collector-story.db"), script = List(6) { "pass" } + "503:3600").start()
        var spool = EventSpoolAndroid.install(app, config())
        val activity = foreground()
        assertTrue(waitUntil { spool.health.value == dev.eventspool.SpoolHealth.Ready })
        val ids = (0 until 500).map { spool.track("story", mapOf("i" to it)) }
        spool.flushBlocking()
        assertTrue(spool.state().state is DeliveryState.Offline)
        assertEquals(0L, collector.requests())

        network(validated = true)
        // A Retry-After past max_retry_elapsed_ms goes to the slow probe at once.
        val waiting = waitUntil { spool.state().state is DeliveryState.WaitingForUser }
        assertTrue("${spool.state()} requests=${collector.requests()} distinct=${collector.distinct()}", waiting)
        assertEquals(300L, collector.distinct())
        assertEquals(200uL, spool.state().pending)

        background(activity)
        assertEquals("background persists what is pending", 200uL, spool.core.stats().pendingDisk)
        assertNotNull(pendingJob())

        lost()
        assertTrue(waitUntil { spool.state().state is DeliveryState.Offline })
        val killed = diskImage()
        val requestsAtKill = collector.requests()
        EventSpoolAndroid.uninstall() // releases the store's lock; its effects are undone below
        restoreDiskImage(killed)
        assertEquals("the released handle sent nothing", requestsAtKill, collector.requests())

        // The new process: Application.onCreate installs again on the same file.
        jobs.cancelAll()
        spool = EventSpoolAndroid.install(app, config())
        assertEquals("what background persisted is what survives", 200uL, spool.core.stats().restored)
        network(validated = true)
        assertNotNull("the validated network schedules the job", pendingJob())
        assertEquals(JobNext.Done, DeliveryJob.run(app, budgetMs = 20_000))
        assertEquals(500, ids.toSet().size)
        assertEquals("no event re-sent under a new id", 500L, collector.distinct())
        assertEquals(0uL, spool.state().pending)
    }
}
