package dev.eventspool.android

import android.app.Application
import dev.eventspool.OkHttpTransport
import dev.eventspool.Spool
import uniffi.eventspool.HttpTransport
import uniffi.eventspool.SpoolConfig

/**
 * The one call an Android app makes, in `Application.onCreate`:
 *
 *     val spool = EventSpoolAndroid.install(this, SpoolConfig(endpoint = URL, dbPath = filesDir.resolve("events.db").path))
 *
 * It owns what every app would otherwise write itself: foreground/background (persist and
 * schedule delivery when the app leaves the screen), the validated default network (online
 * only with NET_CAPABILITY_VALIDATED: "connected" does not prove a working network), metered /
 * power-save / low battery as delivery conditions, and a JobScheduler job that drains within
 * the OS's budget after the process went to the background or was killed.
 */
object EventSpoolAndroid {
    @Volatile private var current: Installation? = null

    /** The installed spool; [install] first. */
    val spool: Spool get() = (current ?: error("EventSpoolAndroid.install(application, config) was not called")).spool

    /**
     * Opens the spool (offline until the system reports a validated network) and registers the
     * callbacks. Installing twice returns the first spool: one store, one worker per process.
     */
    @JvmStatic
    @JvmOverloads
    fun install(application: Application, config: SpoolConfig, transport: HttpTransport? = OkHttpTransport()): Spool =
        synchronized(this) {
            current?.let { return it.spool }
            val spool = Spool(config, transport = transport, startOffline = true)
            current = Installation(application, spool, CoreBridge.attemptTimeoutMs(config)).also { it.register() }
            spool
        }

    /** Unregisters every callback and shuts the spool down (persisting what it holds). */
    @JvmStatic
    fun uninstall(timeoutMs: Long = 5_000) {
        val installation = synchronized(this) { current.also { current = null } } ?: return
        installation.unregister()
        installation.spool.shutdownBlocking(timeoutMs)
        installation.spool.core.close()
    }

    internal fun installation(): Installation? = current
    internal fun installationOrNull(): Installation? = current
}
