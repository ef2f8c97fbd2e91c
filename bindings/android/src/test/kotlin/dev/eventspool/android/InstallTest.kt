package dev.eventspool.android

import android.app.ActivityManager
import android.app.Application
import android.net.ConnectivityManager
import android.os.Process
import dev.eventspool.SpoolHealth
import eventspool.waitUntil
import org.junit.Assert.assertEquals
import org.junit.Assert.assertTrue
import org.junit.Test
import org.junit.runner.RunWith
import org.robolectric.Robolectric
import org.robolectric.RobolectricTestRunner
import org.robolectric.Shadows.shadowOf
import org.robolectric.annotation.Config
import org.robolectric.annotation.Implementation
import org.robolectric.annotation.Implements
import org.robolectric.shadows.ShadowConnectivityManager
import uniffi.eventspool.SpoolConfig
import org.robolectric.shadows.ShadowApplication
import uniffi.eventspool.EncryptionKey
import uniffi.eventspool.EventSpool

/** `install()` never throws into `Application.onCreate`, whatever the process and the store. */
@RunWith(RobolectricTestRunner::class)
class InstallTest : AndroidTestBase() {
    private fun installDoesNotThrow(): Throwable? = runCatching { EventSpoolAndroid.install(app, config()) }.exceptionOrNull()

    private fun settled(): SpoolHealth {
        val spool = EventSpoolAndroid.spool
        assertTrue(waitUntil { spool.health.value !is SpoolHealth.Opening })
        return spool.health.value
    }

    /** The process name as both APIs tell it: `Application.getProcessName()` (28+) and ActivityManager (24-27). */
    private fun processName(name: String) {
        ShadowApplication.setProcessName(name)
        val info = ActivityManager.RunningAppProcessInfo(name, Process.myPid(), arrayOf(app.packageName))
        shadowOf(app.getSystemService(ActivityManager::class.java)).setProcesses(listOf(info))
    }

    @Test
    fun `install in a second process of the app does not throw`() {
        // The main process holds the store (and its lock).
        val main = EventSpool(config(), null, null, true)
        try {
            processName("${app.packageName}:leakcanary")
            val thrown = installDoesNotThrow()
            assertTrue("install() threw in a second process: $thrown", thrown == null)
            val health = settled()
            assertTrue("$health", health is SpoolHealth.Inactive)
            assertEquals(null, EventSpoolAndroid.spool.track("from_leakcanary"))
            assertEquals(mapOf("inactive_process" to 1L), EventSpoolAndroid.spool.handoffStats().refused)
            assertTrue("an inactive process registers no network callback", shadowOf(connectivity).networkCallbacks.isEmpty())
        } finally {
            main.close()
        }
    }

    @Test
    fun `install while the store is held elsewhere does not throw`() {
        val other = EventSpool(config(), null, null, true)
        try {
            val thrown = installDoesNotThrow()
            assertTrue("install() threw: $thrown", thrown == null)
            val health = settled()
            assertTrue("$health", health is SpoolHealth.Failed && "already open" in health.reason)
            assertEquals(null, EventSpoolAndroid.spool.track("while_failed"))
        } finally {
            other.close()
        }
    }

    @Test
    fun `install with a lost encryption key does not throw`() {
        val sealed = config().apply { encryptionKeys = listOf(EncryptionKey(1u, ByteArray(32) { 1 })) }
        EventSpool(sealed, null, null, true).use { old ->
            old.track("before_restore", "{}")
            old.shutdown(5_000uL)
        }
        // A restore to a new device: the Keystore key is gone, a new one is made under the same id.
        val newKey = config().apply { encryptionKeys = listOf(EncryptionKey(1u, ByteArray(32) { 2 })) }
        val thrown = runCatching { EventSpoolAndroid.install(app, newKey) }.exceptionOrNull()
        assertTrue("install() threw with a lost key: $thrown", thrown == null)
        // onKeyLost = Fail (the default): tracking is off, the store is left as it is.
        val health = settled()
        assertTrue("$health", health is SpoolHealth.Failed && "keyId=1" in health.reason)
        assertTrue(db.toFile().exists())
        EventSpoolAndroid.uninstall()

        // onKeyLost = DiscardStore: a new store, tracking works.
        val spool = EventSpoolAndroid.install(app, newKey, options = AndroidOptions(onKeyLost = OnKeyLost.DiscardStore))
        assertEquals(SpoolHealth.Ready, settled())
        assertEquals(0uL, spool.statsBlocking().restored)
        spool.track("after_restore")
        assertEquals(1uL, spool.statsBlocking().tracked)
    }

    @Test
    @Config(shadows = [RefusingConnectivityManager::class])
    fun `install does not throw when the system refuses the network callback`() {
        val thrown = installDoesNotThrow()
        assertTrue("install() threw: $thrown", thrown == null)
        assertEquals(SpoolHealth.Ready, settled())
        EventSpoolAndroid.spool.track("still_tracked")
        assertEquals(1uL, EventSpoolAndroid.spool.statsBlocking().tracked)
    }

    @Test
    fun `a second process with a store of its own tracks`() {
        processName("${app.packageName}:sync")
        val spool = EventSpoolAndroid.install(app, config(), options = AndroidOptions(processStores = mapOf(":sync" to "events-sync.db")))
        assertEquals(SpoolHealth.Ready, settled())
        spool.track("from_sync")
        assertEquals(1uL, spool.statsBlocking().tracked)
        assertTrue(tmp.root.toPath().resolve("events-sync.db").toFile().exists())
        assertTrue("the main store is not touched", !db.toFile().exists())
    }

    @Test
    fun `track before the spool is open waits in the bounded queue, then is recorded`() {
        val spool = EventSpoolAndroid.install(app, config())
        // install() returned at once; whether or not the open has finished, these are kept.
        repeat(20) { spool.track("early", mapOf("i" to it)) }
        assertEquals(20uL, spool.statsBlocking().tracked)
        assertEquals(emptyMap<String, Long>(), spool.handoffStats().refused)
    }

    @Test
    @Config(application = LazyApp::class)
    fun `a job in a process where the app has not installed yet opens the spool itself`() {
        // The process before: three events left in the store.
        EventSpool(config(), null, null, true).use { before ->
            repeat(3) { before.track("earlier", "{}") }
            before.shutdown(5_000uL)
        }
        LazyApp.config = config()
        assertEquals(null, EventSpoolAndroid.spoolOrNull())
        // The new process: the system starts the job; the app installs only when a screen needs it.
        val service = Robolectric.buildService(DeliveryJobService::class.java).create().get()
        assertTrue("the job gave up: no spool installed", service.onStartJob(null))
        network(validated = true)
        assertTrue(waitUntil { shadowOf(service).isJobFinished })
        // The drain may begin before the validated network reaches the new spool: it then ends
        // Blocked(offline), and the network's arrival schedules the next job, which the system
        // starts at once (its network constraint holds). Run it as the system would.
        if (collector.distinct() < 3L) {
            val pending = listOf(DeliveryJob.JOB_ID, DeliveryJob.SUCCESSOR_JOB_ID).mapNotNull { pendingJob(it) }
            assertTrue("a job that ended Blocked leaves the next one pending", pending.isNotEmpty())
            val next = Robolectric.buildService(DeliveryJobService::class.java).create().get()
            assertTrue("the next job gave up", next.onStartJob(null))
            assertTrue(waitUntil { shadowOf(next).isJobFinished })
        }
        assertEquals(3L, collector.distinct())
    }
}

/** An app that installs eventspool lazily, not in `onCreate`: the job asks it for the config. */
class LazyApp : Application(), EventSpoolAndroid.ConfigProvider {
    override fun eventSpoolConfig(): SpoolConfig = checkNotNull(config)

    companion object {
        var config: SpoolConfig? = null
    }
}

/** A system that refuses the default-network callback (a SecurityException, "too many requests"). */
@Implements(ConnectivityManager::class)
class RefusingConnectivityManager : ShadowConnectivityManager() {
    @Implementation
    override fun registerDefaultNetworkCallback(networkCallback: ConnectivityManager.NetworkCallback) {
        throw SecurityException("the system refused the network callback")
    }
}
