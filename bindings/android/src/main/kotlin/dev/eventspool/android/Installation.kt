package dev.eventspool.android

import android.app.Activity
import android.app.Application
import android.content.BroadcastReceiver
import android.content.ComponentCallbacks2
import android.content.Context
import android.content.Intent
import android.content.IntentFilter
import android.content.res.Configuration
import android.net.ConnectivityManager
import android.net.Network
import android.net.NetworkCapabilities
import android.os.BatteryManager
import android.os.Bundle
import android.os.PowerManager
import dev.eventspool.Spool
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors

/** Everything [EventSpoolAndroid.install] registers, so that it can be unregistered as a whole. */
internal class Installation(val application: Application, val spool: Spool, val attemptTimeoutMs: Long) {
    /** persist() writes to disk: never on the main thread the callbacks run on. */
    private val io: ExecutorService = Executors.newSingleThreadExecutor { r -> Thread(r, "eventspool-android").apply { isDaemon = true } }
    private val connectivity = application.getSystemService(ConnectivityManager::class.java)
    private val power = application.getSystemService(PowerManager::class.java)

    @Volatile var conditions = DeviceConditions()
        private set
    /** The last validated state the network callback saw: a job is scheduled on the change to true only. */
    @Volatile private var validated = false
    private var started = 0

    private val lifecycle = object : Application.ActivityLifecycleCallbacks {
        override fun onActivityStarted(activity: Activity) {
            if (started++ == 0) spool.setForeground(true)
        }
        override fun onActivityStopped(activity: Activity) {
            if (started > 0 && --started == 0) onBackground()
        }
        override fun onActivityCreated(activity: Activity, savedInstanceState: Bundle?) {}
        override fun onActivityResumed(activity: Activity) {}
        override fun onActivityPaused(activity: Activity) {}
        override fun onActivitySaveInstanceState(activity: Activity, outState: Bundle) {}
        override fun onActivityDestroyed(activity: Activity) {}
    }

    private val trim = object : ComponentCallbacks2 {
        override fun onTrimMemory(level: Int) {
            // UI_HIDDEN: the last activity left the screen (also when a stop callback was missed).
            if (level >= ComponentCallbacks2.TRIM_MEMORY_UI_HIDDEN) onBackground()
        }
        override fun onConfigurationChanged(newConfig: Configuration) {}
        @Deprecated("ComponentCallbacks.onLowMemory") override fun onLowMemory() {}
    }

    private val network = object : ConnectivityManager.NetworkCallback() {
        override fun onCapabilitiesChanged(network: Network, caps: NetworkCapabilities) {
            val now = caps.hasCapability(NetworkCapabilities.NET_CAPABILITY_VALIDATED)
            // Conditions first: a metered network the config does not deliver on is deferred
            // before it counts as online, so no request slips out in between.
            update(conditions.copy(metered = !caps.hasCapability(NetworkCapabilities.NET_CAPABILITY_NOT_METERED)))
            spool.setOnline(now)
            val wasValidated = validated
            validated = now
            if (now && !wasValidated) scheduleIfPending()
        }
        override fun onLost(network: Network) {
            validated = false
            spool.setOnline(false)
        }
    }

    private val powerReceiver = object : BroadcastReceiver() {
        override fun onReceive(context: Context, intent: Intent) {
            when (intent.action) {
                PowerManager.ACTION_POWER_SAVE_MODE_CHANGED -> update(conditions.copy(lowPower = power.isPowerSaveMode))
                Intent.ACTION_BATTERY_LOW -> update(conditions.copy(batteryLow = true))
                Intent.ACTION_BATTERY_OKAY -> update(conditions.copy(batteryLow = false))
            }
        }
    }

    fun register() {
        application.registerActivityLifecycleCallbacks(lifecycle)
        application.registerComponentCallbacks(trim)
        val filter = IntentFilter().apply {
            addAction(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED)
            addAction(Intent.ACTION_BATTERY_LOW)
            addAction(Intent.ACTION_BATTERY_OKAY)
        }
        application.registerReceiver(powerReceiver, filter)
        update(DeviceConditions(lowPower = power.isPowerSaveMode, batteryLow = batteryLowNow()))
        // Delivers the current default network at once, if there is one.
        connectivity.registerDefaultNetworkCallback(network)
    }

    fun unregister() {
        runCatching { connectivity.unregisterNetworkCallback(network) }
        runCatching { application.unregisterReceiver(powerReceiver) }
        application.unregisterComponentCallbacks(trim)
        application.unregisterActivityLifecycleCallbacks(lifecycle)
        io.shutdown()
    }

    /** The app left the screen: say so, write memory to the store, and make sure a job will deliver. */
    private fun onBackground() {
        spool.setForeground(false)
        io.execute {
            runCatching { spool.persist() }
            DeliveryJob.schedule(application, delayMs = 0)
        }
    }

    /** Waits for the background work queued so far (tests, and code that must know it is on disk). */
    fun awaitBackgroundWork(timeoutMs: Long): Boolean {
        val done = java.util.concurrent.CountDownLatch(1)
        io.execute { done.countDown() }
        return done.await(timeoutMs, java.util.concurrent.TimeUnit.MILLISECONDS)
    }

    private fun update(next: DeviceConditions) {
        val before = conditions
        conditions = next
        CoreBridge.applyConditions(spool, next)
        val cleared = (before.metered && !next.metered) || (before.lowPower && !next.lowPower) || (before.batteryLow && !next.batteryLow)
        if (cleared && validated) scheduleIfPending()
    }

    /**
     * A job ends without a successor when the drain was blocked (offline, deferred): this is
     * where delivery in the background starts again, once the change happened. With nothing
     * pending there is nothing for a job to do (what is tracked later goes out with the next
     * background or the worker).
     */
    private fun scheduleIfPending() {
        if (spool.state().pending > 0uL) DeliveryJob.schedule(application, delayMs = 0)
    }

    private fun batteryLowNow(): Boolean {
        val sticky = application.registerReceiver(null, IntentFilter(Intent.ACTION_BATTERY_CHANGED)) ?: return false
        return sticky.getBooleanExtra(BatteryManager.EXTRA_BATTERY_LOW, false)
    }
}

/** What the device says about delivering now; the core's policy (`deliver_on_*`) decides. */
data class DeviceConditions(val metered: Boolean = false, val lowPower: Boolean = false, val batteryLow: Boolean = false)
