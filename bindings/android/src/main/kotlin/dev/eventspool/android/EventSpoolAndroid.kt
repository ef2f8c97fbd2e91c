package dev.eventspool.android

import android.app.Application
import android.content.Context
import android.os.Looper
import android.util.Log
import dev.eventspool.OkHttpTransport
import dev.eventspool.Spool
import dev.eventspool.SpoolLogger
import dev.eventspool.SpoolUnavailable
import java.io.File
import uniffi.eventspool.EventSpool
import uniffi.eventspool.HttpTransport
import uniffi.eventspool.SpoolConfig
import uniffi.eventspool.SpoolException

/** What to do when the store was sealed with an encryption key the app no longer has. */
enum class OnKeyLost {
    /**
     * Tracking is off ([dev.eventspool.SpoolHealth.Failed], a log line); the store is left as it
     * is, for a key that may come back (a Keystore that is locked until the first unlock).
     */
    Fail,

    /**
     * The store's files are deleted and a new store is started: its events cannot be read by
     * anyone any more (a restore to a new device, a Keystore key invalidated when the lock screen
     * was removed). Logged with the key id.
     */
    DiscardStore,
}

/** The Android layer's own settings, beside the core's [SpoolConfig]. */
data class AndroidOptions(
    val onKeyLost: OnKeyLost = OnKeyLost.Fail,
    /**
     * Processes other than the main one track only when listed here, each with a store file of
     * its own (the name of a file beside `dbPath`): `mapOf(":sync" to "events-sync.db")`. One
     * process owns a store at a time, so a second process of the app (`android:process`,
     * `:leakcanary`) on the main store could never open it; unlisted, it is a counted no-op.
     */
    val processStores: Map<String, String> = emptyMap(),
    /** Throw from `track()` instead of counting and logging (debug builds). */
    val strict: Boolean = false,
    /** Events waiting for the hand-off thread (also before the spool is open) at most. */
    val handoffCapacity: Int = Spool.DEFAULT_HANDOFF_CAPACITY,
    /** Whether `track()` off the main thread may wait for room in a full hand-off (never on the main thread). */
    val waitWhenFull: Boolean = false,
)

/**
 * The one call an Android app makes, in `Application.onCreate`:
 *
 *     EventSpoolAndroid.install(this, SpoolConfig(endpoint = URL, dbPath = noBackupFilesDir.resolve("events.db").path))
 *
 * It returns at once and never throws: the library is loaded and the store opened on a
 * background thread (until then `track()` fills a bounded queue), and a failure there (no
 * library for this ABI, the store held by another process, a lost key) is
 * `spool.health.value == Failed(reason)` plus a log line, with tracking a counted no-op.
 *
 * It owns what every app would otherwise write itself: foreground/background (persist and
 * schedule delivery when the app leaves the screen, not when it rotates), the validated and
 * unblocked default network, metered / power-save / low battery as delivery conditions, a
 * JobScheduler job that drains within the OS's budget after the process went to the background
 * or was killed, and a persist from a chained uncaught-exception handler.
 */
object EventSpoolAndroid {
    @Volatile private var current: Installation? = null

    /** The installed spool; [install] first (or let the job install it from a [ConfigProvider]). */
    val spool: Spool get() = (current ?: error("EventSpoolAndroid.install(application, config) was not called")).spool

    /** The installed spool, or null before [install]. */
    @JvmStatic
    fun spoolOrNull(): Spool? = current?.spool

    /**
     * Implemented by an app's `Application` that installs eventspool lazily (not in
     * `onCreate`): a delivery job started by the system in a fresh process installs from it, so
     * what earlier processes stored is still delivered in the background.
     */
    interface ConfigProvider {
        fun eventSpoolConfig(): SpoolConfig
        fun eventSpoolTransport(): HttpTransport? = OkHttpTransport()
        fun eventSpoolOptions(): AndroidOptions = AndroidOptions()
    }

    /**
     * Starts the spool (opened offline on a background thread, online once the system reports a
     * validated network) and registers the callbacks. Installing twice returns the first spool:
     * one store, one worker per process. Never throws.
     */
    @JvmStatic
    @JvmOverloads
    fun install(
        application: Application,
        config: SpoolConfig,
        transport: HttpTransport? = OkHttpTransport(),
        options: AndroidOptions = AndroidOptions(),
    ): Spool = synchronized(this) {
        current?.let { return it.spool }
        val process = Processes.current(application)
        val storeConfig = Processes.storeFor(process, config, options)
        val spool = Spool.openInBackground(
            config = storeConfig ?: config,
            transport = transport,
            startOffline = true,
            handoffCapacity = options.handoffCapacity,
            strict = options.strict,
            logger = logcat,
            mayWait = { options.waitWhenFull && Looper.myLooper() != Looper.getMainLooper() },
            opener = { c, t, offline ->
                if (storeConfig == null) {
                    throw SpoolUnavailable("process ${process.name} does not track: list it in AndroidOptions.processStores with a store of its own")
                }
                open(c, t, offline, options.onKeyLost)
            },
        )
        val installation = Installation(application, spool, storeConfig ?: config, CoreBridge.attemptTimeoutMs(config), active = storeConfig != null)
        current = installation
        installation.register()
        spool
    }

    /** [install] from the app's [ConfigProvider], for a job that runs before the app installed; null without one. */
    internal fun installFromProvider(context: Context): Spool? {
        val app = context.applicationContext as? Application ?: return null
        val provider = app as? ConfigProvider ?: return null
        return runCatching { install(app, provider.eventSpoolConfig(), provider.eventSpoolTransport(), provider.eventSpoolOptions()) }
            .onFailure { log("eventspool: the app's ConfigProvider failed: $it", it) }
            .getOrNull()
    }

    /** Unregisters every callback and shuts the spool down (persisting what it holds). */
    @JvmStatic
    fun uninstall(timeoutMs: Long = 5_000) {
        val installation = synchronized(this) { current.also { current = null } } ?: return
        installation.unregister()
        installation.spool.shutdownBlocking(timeoutMs)
        runCatching { installation.spool.coreOrNull()?.close() }
    }

    internal fun installation(): Installation? = current
    internal fun installationOrNull(): Installation? = current

    internal val logcat = SpoolLogger { level, message, error ->
        when (level) {
            SpoolLogger.Level.INFO -> Log.i(TAG, message, error)
            SpoolLogger.Level.WARN -> Log.w(TAG, message, error)
            SpoolLogger.Level.ERROR -> Log.e(TAG, message, error)
        }
    }

    internal fun log(message: String, error: Throwable? = null) {
        runCatching { Log.w(TAG, message, error) }
    }

    private const val TAG = "eventspool"

    /** The core's open, with the app's answer to a lost encryption key. */
    private fun open(config: SpoolConfig, transport: HttpTransport?, offline: Boolean, onKeyLost: OnKeyLost): EventSpool =
        try {
            Spool.openCore(config, transport, offline)
        } catch (e: SpoolException.EncryptionKey) {
            if (onKeyLost != OnKeyLost.DiscardStore) throw e
            val db = config.dbPath?.let(::File) ?: throw e
            log("eventspool: the store ${db.name} was sealed with key id ${e.keyId}, which the app no longer has: deleting it and starting a new store (onKeyLost = DiscardStore)")
            for (suffix in listOf("", "-wal", "-shm", "-journal")) File(db.path + suffix).delete()
            Spool.openCore(config, transport, offline)
        }
}
