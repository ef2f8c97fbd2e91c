package dev.eventspool

import java.util.UUID
import java.util.concurrent.CompletableFuture
import java.util.concurrent.ThreadLocalRandom
import java.util.concurrent.TimeUnit
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.flow.MutableStateFlow
import kotlinx.coroutines.flow.StateFlow
import kotlinx.coroutines.flow.asStateFlow
import kotlinx.coroutines.future.await
import kotlinx.coroutines.runInterruptible
import uniffi.eventspool.Consent
import uniffi.eventspool.DeliveryConditions
import uniffi.eventspool.DeliveryObserver
import uniffi.eventspool.DeliveryState
import uniffi.eventspool.DeliveryStatus
import uniffi.eventspool.DrainOutcome
import uniffi.eventspool.EventSpool
import uniffi.eventspool.HttpTransport
import uniffi.eventspool.ObserverHandle
import uniffi.eventspool.Priority
import uniffi.eventspool.SpoolConfig
import uniffi.eventspool.SpoolException
import uniffi.eventspool.SpoolNotice
import uniffi.eventspool.SpoolStats

/**
 * The Kotlin face of eventspool: `track(name, mapOf(...))`, the delivery state and the spool's
 * own health as [StateFlow]s, `suspend` forms of everything that waits. Everything else of the
 * generated API stays reachable as [core].
 *
 * The host app comes first: `track()` never throws (unless [strict], for debug builds) and never
 * waits; what it cannot record is counted by reason ([handoffStats]) and logged. It costs about a
 * microsecond on the calling thread (see [Handoff]): the event goes to a bounded hand-off queue
 * whose one thread records it. That thread also opens the spool when it is made with
 * [openInBackground], so even the library load and the store's open stay off the caller's thread.
 *
 * Durability: unless the config says otherwise (and it has a `dbPath`), the layer runs the core
 * with `durability = always`: the hand-off thread commits each batch it takes (group commit), so
 * a killed process loses only the events of the last few milliseconds, and no commit ever runs
 * on a thread that called `track()`.
 */
class Spool private constructor(
    config: SpoolConfig,
    private val transport: HttpTransport?,
    private val startOffline: Boolean,
    handoffCapacity: Int,
    onRejected: (HandoffRejected) -> Unit,
    /** Throw from `track()` instead of counting (debug builds: a bad call shows at once). */
    val strict: Boolean,
    private val logger: SpoolLogger,
    mayWait: () -> Boolean,
    private val opener: (SpoolConfig, HttpTransport?, Boolean) -> EventSpool,
    inBackground: Boolean,
) : AutoCloseable {
    /**
     * Opens the spool on the calling thread: an open that fails throws here (the core's
     * [SpoolException]). `track()` and the other calls never throw after that.
     */
    constructor(
        config: SpoolConfig,
        transport: HttpTransport? = null,
        startOffline: Boolean = false,
        /** Events waiting for the hand-off thread at most; beyond, `track()` counts `handoff_full`. */
        handoffCapacity: Int = DEFAULT_HANDOFF_CAPACITY,
        /** Called on the hand-off thread for an event the core refused after `track()` returned. */
        onRejected: (HandoffRejected) -> Unit = {},
        strict: Boolean = false,
        logger: SpoolLogger = SpoolLogger.JavaLogging,
        /** Whether a `track()` on this thread may wait for room in a full hand-off (never a UI thread). */
        mayWait: () -> Boolean = { false },
    ) : this(config, transport, startOffline, handoffCapacity, onRejected, strict, logger, mayWait, ::openCore, inBackground = false)

    private val config: SpoolConfig = withLayerDefaults(config)
    private val refused = Refusals("track() recorded nothing", logger)
    private val rejected = Refusals("the core refused events after track() returned", logger)
    private val healthFlow = MutableStateFlow<SpoolHealth>(SpoolHealth.Opening)
    private val statusFlow = MutableStateFlow(DeliveryStatus(DeliveryState.Offline, 0uL, "opening"))
    private val opened = CompletableFuture<EventSpool>()
    @Volatile private var coreRef: EventSpool? = null
    private var observer: ObserverHandle? = null
    @Volatile private var enabled = true
    @Volatile private var consentDenied = false
    @Volatile private var closed = false

    /** The platform's last word on each of these, applied when the spool opens if it came before. */
    private val platform = Object()
    private var online: Boolean? = null
    private var foreground: Boolean? = null
    private var conditions: DeliveryConditions? = null

    private val handoff: Handoff

    init {
        require(handoffCapacity > 0) { "handoffCapacity must be > 0" }
        // Opened here on the caller's thread when asked: a failure throws from the constructor.
        val early = if (inBackground) null else openNow()
        handoff = Handoff(
            capacity = handoffCapacity,
            maxBatch = MAX_BATCH,
            open = { early ?: if (inBackground) openNowCounted() else null },
            mayWait = mayWait,
            onRejected = onRejected,
            refused = refused,
            rejected = rejected,
            unavailable = ::unavailable,
            logger = logger,
        )
    }

    /** The generated spool, for what this layer does not wrap (quarantine, purge, observers). Waits for the open (not on a UI thread). */
    val core: EventSpool
        get() = coreRef ?: try {
            opened.get(OPEN_WAIT_MS, TimeUnit.MILLISECONDS)
        } catch (e: Exception) {
            throw SpoolUnavailable(unavailable().second, e.cause ?: e)
        }

    /** The generated spool if it is open, without waiting. */
    fun coreOrNull(): EventSpool? = coreRef

    /** The delivery state; updated on the SDK's worker thread, collect it on any dispatcher. */
    val status: StateFlow<DeliveryStatus> = statusFlow.asStateFlow()

    /** Whether the spool is open: [SpoolHealth.Opening], `Ready`, `Failed(reason)` or `Inactive`. */
    val health: StateFlow<SpoolHealth> = healthFlow.asStateFlow()

    /**
     * Records an event and returns its `event_id` (fixed now, kept through every retry), or null
     * when it recorded nothing: tracking disabled or consent denied, an empty name, a property
     * with no JSON form (`NaN`, a `Thread`), a full hand-off, a spool that failed to open. Each is
     * counted in [handoffStats]`.refused` by reason and logged; with [strict] it throws instead
     * ([PropertyException], [SpoolException], [SpoolUnavailable]). What only the core can tell
     * later (too large, a name the collector drops) goes to `onRejected` and
     * [handoffStats]`.rejected`. Never waits (see `mayWait`); [Priority.CRITICAL] events are
     * committed and sent first by the core, still off this thread.
     */
    fun track(name: String, properties: Map<String, Any?> = emptyMap(), priority: Priority = Priority.NORMAL): String? {
        val pending = admit(name, properties, priority, null) ?: return null
        return if (handoff.offer(pending)) pending.id else null
    }

    /**
     * `track()` that suspends until the core recorded the event: under the layer's default
     * `durability = always`, or for a [Priority.CRITICAL] event, until it is in the store.
     * Returns the id, or null when it was not recorded (counted, as for `track()`).
     */
    suspend fun trackDurably(name: String, properties: Map<String, Any?> = emptyMap(), priority: Priority = Priority.NORMAL): String? {
        val done = CompletableFuture<Boolean>()
        val pending = admit(name, properties, priority, done) ?: return null
        if (!handoff.offer(pending)) return null
        return if (done.await()) pending.id else null
    }

    /** [trackDurably] for code that is not in a coroutine (never on a UI thread). */
    fun trackDurablyBlocking(name: String, properties: Map<String, Any?> = emptyMap(), priority: Priority = Priority.NORMAL): String? {
        val done = CompletableFuture<Boolean>()
        val pending = admit(name, properties, priority, done) ?: return null
        if (!handoff.offer(pending)) return null
        return if (runCatching { done.get(WAIT_MS, TimeUnit.MILLISECONDS) }.getOrDefault(false)) pending.id else null
    }

    /**
     * The checks `track()` can make at once. A refusal is counted by reason (or thrown, when
     * strict); no exception is made for it otherwise: a refused call costs what an accepted one
     * does, not a stack trace.
     */
    private fun admit(name: String, properties: Map<String, Any?>, priority: Priority, done: CompletableFuture<Boolean>?): Handoff.Pending? {
        when {
            closed -> return refuse("shut_down") { SpoolException.ShutDown() }
            !enabled -> return refuse("tracking_disabled") { SpoolException.TrackingDisabled() }
            consentDenied -> return refuse("consent_denied") { SpoolException.ConsentDenied() }
            name.isEmpty() -> return refuse("invalid_event") { SpoolException.InvalidEvent("name is empty") }
        }
        when (val h = healthFlow.value) {
            is SpoolHealth.Failed -> return refuse("spool_failed") { SpoolUnavailable(h.reason, h.cause) }
            is SpoolHealth.Inactive -> return refuse("inactive_process") { SpoolUnavailable(h.reason) }
            else -> {}
        }
        val json = try {
            Properties.toJson(properties)
        } catch (e: PropertyException) {
            return refuse("invalid_property") { e }
        }
        val now = System.currentTimeMillis()
        return Handoff.Pending(name, json, uuidV7(now), now, priority, done)
    }

    private inline fun refuse(reason: String, crossinline error: () -> Throwable): Handoff.Pending? {
        if (strict) throw error()
        refused.count(reason) { error().let { it.message ?: it.toString() } }
        return null
    }

    fun setOnline(online: Boolean) = platformVerb({ this.online = online }) { it.setOnline(online) }
    fun setForeground(foreground: Boolean) = platformVerb({ this.foreground = foreground }) { it.setForeground(foreground) }

    /** The device's conditions (metered, power saving, low battery); the config's `deliverOn*` decide. */
    fun setConditions(conditions: DeliveryConditions) = platformVerb({ this.conditions = conditions }) { it.setConditions(conditions) }

    private fun platformVerb(remember: () -> Unit, call: (EventSpool) -> Unit) {
        synchronized(platform) {
            remember()
            coreRef?.let { runCatching { call(it) } }
        }
    }

    /** "Retry now", in order after what was tracked before. */
    fun retryNow() {
        handoff.control { it?.retryNow() }
    }

    fun state(): DeliveryStatus = coreRef?.let { runCatching { it.state() }.getOrNull() } ?: statusFlow.value

    /**
     * Opt-out, at once and without waiting: later `track()` calls record nothing (counted as
     * `tracking_disabled`); what was tracked before is recorded first, then the core stops.
     */
    fun setEnabled(enabled: Boolean) {
        if (!enabled) this.enabled = false
        handoff.control { it?.setEnabled(enabled) }
        if (enabled) this.enabled = true
    }

    /** [setEnabled], returning once the core has it (and everything tracked before). */
    suspend fun setEnabledAndWait(enabled: Boolean) {
        if (!enabled) this.enabled = false
        handoff.control { it?.setEnabled(enabled) }.await()
        if (enabled) this.enabled = true
    }

    /**
     * Tracking consent (README §Consent), in order after what was tracked before; under `DENIED`
     * later `track()` calls are refused at once (counted as `consent_denied`). Returns once the
     * core recorded it in the store.
     */
    suspend fun setConsent(consent: Consent) {
        consentDenied = consent == Consent.DENIED
        handoff.control { core -> core?.setConsent(consent) ?: throw SpoolUnavailable(unavailable().second) }.await()
    }

    /** Hands over what `track()` accepted, then writes the core's memory to the store (app to background). */
    suspend fun persist(): ULong {
        var written = 0uL
        handoff.control { written = it?.persist() ?: 0uL }.await()
        return written
    }

    /** [persist] for code that is not in a coroutine (never on a UI thread). */
    fun persistBlocking(timeoutMs: Long = WAIT_MS): ULong {
        handoff.awaitHandedOff(timeoutMs)
        return coreRef?.persist() ?: 0uL
    }

    /** The core's figures, once what was tracked before this call reached it. */
    suspend fun stats(): SpoolStats = runInterruptible(Dispatchers.IO) { statsBlocking() }

    /** [stats] for code that is not in a coroutine (never on a UI thread). */
    fun statsBlocking(): SpoolStats {
        handoff.awaitHandedOff(WAIT_MS)
        return core.stats()
    }

    fun handoffStats(): HandoffStats = handoff.stats()

    /** Blocking flush, for code that is not in a coroutine (never on a UI thread). */
    fun flushBlocking() {
        handoff.awaitHandedOff(WAIT_MS)
        coreRef?.flush()
    }

    /** Sends what is pending now; returns once it was handed to the worker (not when delivered). */
    suspend fun flush() {
        handoff.control { it?.flush() }.await()
    }

    /** Suspends until nothing is pending and delivery is idle, or [timeoutMs] passed; false then. */
    suspend fun awaitDrained(timeoutMs: Long): Boolean = runInterruptible(Dispatchers.IO) { waitDrainedBlocking(timeoutMs) }

    fun waitDrainedBlocking(timeoutMs: Long): Boolean {
        val start = System.nanoTime()
        if (!handoff.awaitHandedOff(timeoutMs)) return false
        val left = timeoutMs - (System.nanoTime() - start) / 1_000_000
        val core = coreRef ?: return false
        return left > 0 && core.waitDrained(left.toULong())
    }

    /**
     * The bounded drain for a platform's background job: hands over what `track()` accepted,
     * then runs the core's `deliverWithin` with what is left of [budgetMs]. The outcome can
     * come up to the config's `attemptTimeoutMs` after the budget (a request in flight is
     * waited for), so pass the platform's budget minus that. Never on a UI thread.
     */
    fun deliverWithinBlocking(budgetMs: Long): DrainOutcome {
        val start = System.nanoTime()
        handoff.awaitHandedOff(budgetMs.coerceAtLeast(0))
        val left = budgetMs - (System.nanoTime() - start) / 1_000_000
        val core = coreRef ?: return DrainOutcome.Blocked(state())
        return core.deliverWithin(left.coerceAtLeast(0).toULong())
    }

    suspend fun deliverWithin(budgetMs: Long): DrainOutcome = runInterruptible(Dispatchers.IO) { deliverWithinBlocking(budgetMs) }

    /**
     * For a process that is about to die (an uncaught exception): hands over what waits and
     * persists, within [timeoutMs]; never throws. Under `durability = always` there is little
     * left to write: the events of the batch in progress.
     */
    fun persistBeforeDeath(timeoutMs: Long) {
        runCatching {
            if (handoff.awaitHandedOff(timeoutMs)) coreRef?.persist()
        }
    }

    /** Hands over the rest, stops delivery (waiting at most [timeoutMs] for a request), persists, releases the store. */
    suspend fun shutdown(timeoutMs: Long = 5_000) = runInterruptible(Dispatchers.IO) { shutdownBlocking(timeoutMs) }

    fun shutdownBlocking(timeoutMs: Long = 5_000) {
        if (closed) return
        closed = true
        handoff.close(timeoutMs)
        observer?.close()
        val core = coreRef ?: return
        runCatching { core.shutdown(timeoutMs.toULong()) }
        statusFlow.value = core.state()
    }

    /** Shuts down (5 s for a request in flight) and frees the native object. */
    override fun close() {
        shutdownBlocking()
        coreRef?.close()
    }

    /** Opens on the caller's thread (the public constructor): a failure throws from there. */
    private fun openNow(): EventSpool {
        val core = try {
            opener(config, transport, startOffline)
        } catch (e: Throwable) {
            healthFlow.value = SpoolHealth.Failed(describe(e), e)
            opened.completeExceptionally(e)
            throw e
        }
        ready(core)
        return core
    }

    /** Opens on the hand-off thread: a failure becomes [SpoolHealth.Failed] and a log line. */
    private fun openNowCounted(): EventSpool? = try {
        opener(config, transport, startOffline).also(::ready)
    } catch (e: Throwable) {
        // UnsatisfiedLinkError (no library for this ABI), the store held elsewhere, a lost key...
        val failed = (e as? SpoolUnavailable)?.let { SpoolHealth.Inactive(it.reason) } ?: SpoolHealth.Failed(describe(e), e)
        healthFlow.value = failed
        runCatching { logger.log(SpoolLogger.Level.ERROR, "eventspool: the spool did not open, tracking is off: ${describe(e)}", e) }
        opened.completeExceptionally(e)
        null
    }

    private fun ready(core: EventSpool) {
        consentDenied = runCatching { core.consent() == Consent.DENIED }.getOrDefault(false)
        observer = runCatching {
            core.addObserver(object : DeliveryObserver {
                override fun onState(status: DeliveryStatus) {
                    statusFlow.value = status
                }
                override fun onNotice(notice: SpoolNotice) {}
            })
        }.getOrNull()
        statusFlow.value = runCatching { core.state() }.getOrDefault(statusFlow.value)
        synchronized(platform) {
            coreRef = core
            conditions?.let { runCatching { core.setConditions(it) } }
            foreground?.let { runCatching { core.setForeground(it) } }
            online?.let { runCatching { core.setOnline(it) } }
        }
        healthFlow.value = SpoolHealth.Ready
        opened.complete(core)
    }

    /** The counters' reason and the log's text while nothing can be recorded. */
    private fun unavailable(): Pair<String, String> = when (val h = healthFlow.value) {
        is SpoolHealth.Inactive -> "inactive_process" to h.reason
        is SpoolHealth.Failed -> "spool_failed" to h.reason
        else -> "spool_failed" to "the spool is not open"
    }

    companion object {
        const val DEFAULT_HANDOFF_CAPACITY = 4096
        /** Events per `track_batch_report` call: big enough to spread the FFI cost, small enough to keep a batch quick. */
        const val MAX_BATCH = 512
        private const val WAIT_MS = 10_000L
        private const val OPEN_WAIT_MS = 10_000L

        /**
         * A spool whose open (library load, store, migration) runs on its hand-off thread: returns
         * at once, never throws. Until it is open, `track()` fills the bounded hand-off (the
         * pre-open queue) and the platform verbs are remembered; a failed open is
         * [SpoolHealth.Failed] in [health] and a log line, and tracking becomes a counted no-op.
         * [opener] opens the core (the Android layer's handles a lost key there); throw
         * [SpoolUnavailable] from it for a process that does not track ([SpoolHealth.Inactive]).
         */
        @JvmStatic
        @JvmOverloads
        fun openInBackground(
            config: SpoolConfig,
            transport: HttpTransport? = null,
            startOffline: Boolean = false,
            handoffCapacity: Int = DEFAULT_HANDOFF_CAPACITY,
            onRejected: (HandoffRejected) -> Unit = {},
            strict: Boolean = false,
            logger: SpoolLogger = SpoolLogger.JavaLogging,
            mayWait: () -> Boolean = { false },
            opener: (SpoolConfig, HttpTransport?, Boolean) -> EventSpool = ::openCore,
        ): Spool = Spool(config, transport, startOffline, handoffCapacity, onRejected, strict, logger, mayWait, opener, inBackground = true)

        /** The core's own open. */
        @JvmStatic
        fun openCore(config: SpoolConfig, transport: HttpTransport?, startOffline: Boolean): EventSpool =
            EventSpool(config, transport, null, startOffline)

        /**
         * The layer's defaults over the core's: `durability = always` where the config leaves it
         * unset and there is a store, because the hand-off thread's commit costs the caller
         * nothing and a killed process then loses milliseconds of events, not a memory's worth.
         */
        internal fun withLayerDefaults(config: SpoolConfig): SpoolConfig =
            if (config.durability == null && config.dbPath != null) config.copy(durability = "always") else config

        internal fun describe(e: Throwable): String = when (e) {
            is SpoolUnavailable -> e.reason
            is SpoolException -> "${e::class.simpleName}: ${e.message}"
            is UnsatisfiedLinkError -> "the native library is missing for this device's ABI: ${e.message}"
            else -> e.toString()
        }

        /** A UUIDv7 (time-ordered, as the core's own ids) from a thread-local generator: no lock, no syscall. */
        internal fun uuidV7(nowMs: Long): String {
            val r = ThreadLocalRandom.current()
            val msb = (nowMs shl 16) or 0x7000L or (r.nextLong() and 0x0FFFL)
            val lsb = (r.nextLong() and 0x3FFFFFFFFFFFFFFFL) or Long.MIN_VALUE
            return UUID(msb, lsb).toString()
        }
    }
}
