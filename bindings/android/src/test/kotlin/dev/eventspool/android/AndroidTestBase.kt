package dev.eventspool.android

import android.app.Activity
import android.app.Application
import android.app.job.JobInfo
import android.app.job.JobScheduler
import android.net.ConnectivityManager
import android.net.NetworkCapabilities
import android.os.Looper
import eventspool.CollectorProcess
import eventspool.fastConfig
import java.nio.file.Path
import org.junit.After
import org.junit.Assert.assertTrue
import org.junit.Before
import org.junit.Rule
import org.junit.rules.TemporaryFolder
import org.robolectric.Robolectric
import org.robolectric.RuntimeEnvironment
import org.robolectric.Shadows.shadowOf
import org.robolectric.android.controller.ActivityController
import org.robolectric.shadows.ShadowNetwork
import org.robolectric.shadows.ShadowNetworkCapabilities
import uniffi.eventspool.SpoolConfig

/**
 * What every Android suite shares: the application, a collector process per test, the store in a
 * temporary folder, and what the system tells the layer (network callbacks, activities).
 */
abstract class AndroidTestBase {
    @get:Rule val tmp = TemporaryFolder()
    protected lateinit var collector: CollectorProcess
    protected lateinit var app: Application
    protected val db: Path get() = tmp.root.toPath().resolve("events.db")

    @Before
    fun setUpBase() {
        app = RuntimeEnvironment.getApplication()
        collector = CollectorProcess(tmp.root.toPath().resolve("collector.db")).start()
    }

    @After
    fun tearDownBase() {
        DeliveryJob.scheduler = null
        EventSpoolAndroid.uninstall()
        collector.stop()
    }

    /** A collector answering the first POSTs from [script] ("503:3600"), in place of the plain one. */
    protected fun scriptedCollector(vararg script: String) {
        collector.stop()
        collector = CollectorProcess(tmp.root.toPath().resolve("collector-scripted.db"), script = script.toList()).start()
    }

    protected open fun config(): SpoolConfig = fastConfig(collector.url, db, maxBatchEvents = 50uL)

    protected val connectivity: ConnectivityManager get() = app.getSystemService(ConnectivityManager::class.java)
    protected val jobs: JobScheduler get() = app.getSystemService(JobScheduler::class.java)

    /** What the system tells the default-network callbacks about a network. */
    protected fun network(validated: Boolean, metered: Boolean = false) {
        val caps = ShadowNetworkCapabilities.newInstance()
        shadowOf(caps).addTransportType(NetworkCapabilities.TRANSPORT_WIFI)
        shadowOf(caps).addCapability(NetworkCapabilities.NET_CAPABILITY_INTERNET)
        if (validated) shadowOf(caps).addCapability(NetworkCapabilities.NET_CAPABILITY_VALIDATED)
        if (!metered) shadowOf(caps).addCapability(NetworkCapabilities.NET_CAPABILITY_NOT_METERED)
        val callbacks = shadowOf(connectivity).networkCallbacks
        assertTrue("install registers the default-network callback", callbacks.isNotEmpty())
        callbacks.forEach { it.onCapabilitiesChanged(ShadowNetwork.newInstance(7), caps) }
    }

    protected fun lost() = shadowOf(connectivity).networkCallbacks.forEach { it.onLost(ShadowNetwork.newInstance(7)) }

    protected fun foreground(): ActivityController<Activity> = Robolectric.buildActivity(Activity::class.java).setup()

    protected fun idleMain() = shadowOf(Looper.getMainLooper()).idle()

    protected fun pendingJob(id: Int = DeliveryJob.JOB_ID): JobInfo? = jobs.getPendingJob(id)
}
