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
import android.os.Build
import android.os.Bundle
import android.os.Handler
import android.os.Looper
import android.os.PowerManager
import dev.eventspool.Spool
import java.util.concurrent.CountDownLatch
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors
import java.util.concurrent.TimeUnit
import uniffi.eventspool.SpoolConfig

/** Everything [EventSpoolAndroid.install] registers, so that it can be unregistered as a whole. */
internal class Installation(
    val application: Application,
    val spool: Spool,
    val config: SpoolConfig,
    val attemptTimeoutMs: Long,
    /** False in a process that does not track: nothing is registered. */
    private val active: Boolean,
) {
    /** persist() writes to disk: never on the main thread the callbacks run on. */
    private val io: ExecutorService = Executors.newSingleThreadExecutor { r -> Thread(r, "eventspool-android").apply { isDaemon = true } }
    private val main = Handler(Looper.getMainLooper())

    /** One lock for read, change and hand-over: the network callback's thread and the main thread both update them. */
    private val conditionsLock = Object()
    @Volatile var conditions = DeviceConditions()
        private set

    /** What the default-network callback last said; online = validated and not blocked. */
    @Volatile private var validated = false
    @Volatile private var blocked = false

    // Lifecycle state, touched on the main thread only.
    private var started = 0
    private var inBackground = false
    private val goBackground = Runnable { onBackground() }

    private val lifecycle = object : Application.ActivityLifecycleCallbacks {
        override fun onActivityStarted(activity: Activity) {
            if (started++ > 0) return
            // Back within the debounce (a rotation, a quick switch): it never left, nothing to tell.
            main.removeCallbacks(goBackground)
            if (inBackground) {
                inBackground = false
                spool.setForeground(true)
            }
        }

        override fun onActivityStopped(activity: Activity) {
            if (started == 0 || --started > 0) return
            // ProcessLifecycleOwner's rule: the last activity stopping is a trip to the background
            // only if no activity starts within the debounce, which a configuration change's new
            // instance always does; so a rotation neither persists nor starts a fresh episode.
            main.postDelayed(goBackground, BACKGROUND_DEBOUNCE_MS)
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
            if (level >= ComponentCallbacks2.TRIM_MEMORY_UI_HIDDEN) {
                main.removeCallbacks(goBackground)
                onBackground()
            }
        }
        override fun onConfigurationChanged(newConfig: Configuration) {}
        @Deprecated("ComponentCallbacks.onLowMemory") override fun onLowMemory() {}
    }

    private val network = object : ConnectivityManager.NetworkCallback() {
        override fun onCapabilitiesChanged(network: Network, caps: NetworkCapabilities) {
            val now = caps.hasCapability(NetworkCapabilities.NET_CAPABILITY_VALIDATED)
            // Conditions first: a metered network the config does not deliver on is deferred
            // before it counts as online, so no request slips out in between.
            update { it.copy(metered = !caps.hasCapability(NetworkCapabilities.NET_CAPABILITY_NOT_METERED)) }
            online(validated = now, blocked = blocked)
        }

        /**
         * Doze, Data Saver, a background restriction: the network is there and validated, but
         * this app's traffic is blocked. Offline meanwhile, so no attempt burns the retry budget.
         */
        override fun onBlockedStatusChanged(network: Network, blocked: Boolean) {
            online(validated = validated, blocked = blocked)
        }

        override fun onLost(network: Network) {
            online(validated = false, blocked = false)
        }
    }

    private val powerReceiver = object : BroadcastReceiver() {
        override fun onReceive(context: Context, intent: Intent) {
            when (intent.action) {
                PowerManager.ACTION_POWER_SAVE_MODE_CHANGED -> update { it.copy(lowPower = power()?.isPowerSaveMode == true) }
                Intent.ACTION_BATTERY_LOW -> update { it.copy(batteryLow = true) }
                Intent.ACTION_BATTERY_OKAY -> update { it.copy(batteryLow = false) }
            }
        }
    }

    private var previousHandler: Thread.UncaughtExceptionHandler? = null
    private val crashHandler = Thread.UncaughtExceptionHandler { thread, error ->
        // Whatever waits in the hand-off goes to the store before the process dies.
        spool.persistBeforeDeath(CRASH_PERSIST_MS)
        previousHandler?.uncaughtException(thread, error)
    }

    /** Each registration on its own: one that fails (a SecurityException, "too many requests") is logged, the others stay. */
    fun register() {
        if (!active) return
        guarded("activity lifecycle callbacks") { application.registerActivityLifecycleCallbacks(lifecycle) }
        guarded("trim-memory callbacks") { application.registerComponentCallbacks(trim) }
        guarded("power and battery broadcasts") {
            val filter = IntentFilter().apply {
                addAction(PowerManager.ACTION_POWER_SAVE_MODE_CHANGED)
                addAction(Intent.ACTION_BATTERY_LOW)
                addAction(Intent.ACTION_BATTERY_OKAY)
            }
            application.registerReceiver(powerReceiver, filter)
        }
        guarded("power and battery state") { update { DeviceConditions(metered = it.metered, lowPower = power()?.isPowerSaveMode == true, batteryLow = batteryLowNow()) } }
        // Delivers the current default network at once, if there is one. Without it the layer
        // cannot tell: it goes online and lets the core's retries find out.
        val networkKnown = guarded("default-network callback") {
            application.getSystemService(ConnectivityManager::class.java).registerDefaultNetworkCallback(network)
        }
        if (!networkKnown) spool.setOnline(true)
        guarded("uncaught-exception handler") {
            previousHandler = Thread.getDefaultUncaughtExceptionHandler()
            Thread.setDefaultUncaughtExceptionHandler(crashHandler)
        }
    }

    fun unregister() {
        if (active) {
            runCatching { application.getSystemService(ConnectivityManager::class.java).unregisterNetworkCallback(network) }
            runCatching { application.unregisterReceiver(powerReceiver) }
            runCatching { application.unregisterComponentCallbacks(trim) }
            runCatching { application.unregisterActivityLifecycleCallbacks(lifecycle) }
            runCatching { main.removeCallbacks(goBackground) }
            if (Thread.getDefaultUncaughtExceptionHandler() === crashHandler) Thread.setDefaultUncaughtExceptionHandler(previousHandler)
        }
        io.shutdown()
    }

    private fun guarded(what: String, register: () -> Unit): Boolean = try {
        register()
        true
    } catch (e: Throwable) {
        EventSpoolAndroid.log("eventspool: could not register the $what, going on without: $e", e)
        false
    }

    private fun online(validated: Boolean, blocked: Boolean) {
        val wasOnline = this.validated && !this.blocked
        this.validated = validated
        this.blocked = blocked
        val now = validated && !blocked
        spool.setOnline(now)
        if (now && !wasOnline) scheduleIfPending()
    }

    /** The app left the screen: say so, write memory to the store, and make sure a job will deliver. */
    private fun onBackground() {
        if (inBackground) return
        inBackground = true
        spool.setForeground(false)
        io.execute {
            runCatching { spool.persistBlocking() }
            scheduleIfPending()
        }
    }

    /** Waits for the background work queued so far (tests, and code that must know it is on disk). */
    fun awaitBackgroundWork(timeoutMs: Long): Boolean {
        val done = CountDownLatch(1)
        io.execute { done.countDown() }
        return done.await(timeoutMs, TimeUnit.MILLISECONDS)
    }

    private fun update(change: (DeviceConditions) -> DeviceConditions) {
        synchronized(conditionsLock) {
            val before = conditions
            val next = change(before)
            conditions = next
            CoreBridge.applyConditions(spool, next)
            val cleared = (before.metered && !next.metered) || (before.lowPower && !next.lowPower) || (before.batteryLow && !next.batteryLow)
            if (cleared && validated && !blocked) scheduleIfPending()
        }
    }

    /**
     * A job ends without a successor when the drain was blocked (offline, deferred): this is
     * where delivery in the background starts again, once the change happened. With nothing
     * pending there is nothing for a job to do (what is tracked later goes out with the next
     * background or the worker).
     */
    private fun scheduleIfPending() {
        // What the hand-off still holds counts: it reaches the core before any drain does.
        if (spool.state().pending > 0uL || spool.handoffStats().queued > 0) DeliveryJob.schedule(application, delayMs = 0)
    }

    private fun power(): PowerManager? = application.getSystemService(PowerManager::class.java)

    /** API 28 added `EXTRA_BATTERY_LOW`; before it, the system's own rule from the level: at most 15 %, unplugged. */
    private fun batteryLowNow(): Boolean {
        val sticky = application.registerReceiver(null, IntentFilter(Intent.ACTION_BATTERY_CHANGED)) ?: return false
        if (Build.VERSION.SDK_INT >= Build.VERSION_CODES.P && sticky.hasExtra(BatteryManager.EXTRA_BATTERY_LOW)) {
            return sticky.getBooleanExtra(BatteryManager.EXTRA_BATTERY_LOW, false)
        }
        val level = sticky.getIntExtra(BatteryManager.EXTRA_LEVEL, -1)
        val scale = sticky.getIntExtra(BatteryManager.EXTRA_SCALE, -1)
        val plugged = sticky.getIntExtra(BatteryManager.EXTRA_PLUGGED, 0) != 0
        return level >= 0 && scale > 0 && !plugged && level * 100 <= LOW_BATTERY_PERCENT * scale
    }

    companion object {
        /** As androidx's ProcessLifecycleOwner: long enough for a configuration change's new activity. */
        const val BACKGROUND_DEBOUNCE_MS = 700L
        /** The framework's default `config_lowBatteryWarningLevel`. */
        const val LOW_BATTERY_PERCENT = 15
        private const val CRASH_PERSIST_MS = 500L
    }
}

/** What the device says about delivering now; the core's policy (`deliver_on_*`) decides. */
data class DeviceConditions(val metered: Boolean = false, val lowPower: Boolean = false, val batteryLow: Boolean = false)
