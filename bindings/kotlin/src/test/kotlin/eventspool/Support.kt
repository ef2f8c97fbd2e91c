package eventspool

import java.io.BufferedReader
import java.io.InputStreamReader
import java.net.URI
import java.net.http.HttpClient
import java.net.http.HttpConnectTimeoutException
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import java.net.http.HttpTimeoutException
import java.nio.file.Path
import java.time.Duration
import java.util.concurrent.CopyOnWriteArrayList
import java.util.concurrent.atomic.AtomicInteger
import uniffi.eventspool.DeliveryObserver
import uniffi.eventspool.DeliveryState
import uniffi.eventspool.DeliveryStatus
import uniffi.eventspool.HttpTransport
import uniffi.eventspool.HttpTransportException
import uniffi.eventspool.SpoolConfig
import uniffi.eventspool.SpoolNotice
import uniffi.eventspool.TransportRequest
import uniffi.eventspool.TransportResponse

/**
 * The reference collector as a separate process: [stop] is a real outage (the port refuses
 * connections), [start] the recovery on the same port with the same database, so events stored
 * before the outage still count as stored.
 */
class CollectorProcess(
    private val db: Path,
    /** Answers for the first POSTs, in order, as `collector_process --script` takes them ("503:1"). */
    private val script: List<String> = emptyList(),
) : AutoCloseable {
    private val binary = System.getProperty("eventspool.collector")
        ?: error("system property eventspool.collector (path of collector_process) is not set")
    private var process: Process? = null
    var port = 0
        private set
    lateinit var url: String
        private set

    fun start(): CollectorProcess {
        val args = listOf(binary, "--listen", "127.0.0.1:$port", "--db", db.toString()) + script.flatMap { listOf("--script", it) }
        val p = ProcessBuilder(args)
            .redirectError(ProcessBuilder.Redirect.INHERIT)
            .start()
        val line = BufferedReader(InputStreamReader(p.inputStream)).readLine()
        check(line != null && line.startsWith("http://")) { "collector did not start: $line" }
        url = line
        port = URI(line).port
        process = p
        return this
    }

    fun stop() {
        process?.let {
            it.destroyForcibly()
            it.waitFor()
        }
        process = null
    }

    /** Distinct event ids stored, from the collector's `GET /stats`. */
    fun distinct(): Long = stat("distinct")

    /** Event copies received (duplicates included). */
    fun received(): Long = stat("received")

    /** Batch requests answered, scripted ones included. */
    fun requests(): Long = stat("requests")

    private fun stat(name: String): Long {
        val request = HttpRequest.newBuilder(URI("http://127.0.0.1:$port/stats")).GET().build()
        val body = plainClient.send(request, HttpResponse.BodyHandlers.ofString()).body()
        return Regex("\"$name\"\\s*:\\s*(\\d+)").find(body)!!.groupValues[1].toLong()
    }

    /** The properties JSON the collector stored for each event named [name], read from its SQLite file. */
    fun storedProperties(name: String): List<String> =
        java.sql.DriverManager.getConnection("jdbc:sqlite:file:$db?mode=ro").use { c ->
            c.prepareStatement("SELECT properties FROM events WHERE name = ? ORDER BY timestamp, event_id").use { st ->
                st.setString(1, name)
                st.executeQuery().use { rs -> buildList { while (rs.next()) add(rs.getString(1)) } }
            }
        }

    override fun close() = stop()

    companion object {
        val plainClient: HttpClient = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build()
    }
}

/** Retries in milliseconds: base 50 ms, cap 200 ms, three automatic attempts. */
fun fastConfig(url: String, db: Path, maxBatchEvents: ULong? = null) = SpoolConfig(
    endpoint = url,
    dbPath = db.toString(),
    backoffBaseMs = 50uL,
    backoffCapMs = 200uL,
    maxAutoAttempts = 3u,
    minBatchIntervalMs = 0uL,
    attemptTimeoutMs = 2_000uL,
    flushIntervalMs = 3_600_000uL,
    maxBatchEvents = maxBatchEvents,
)

fun waitUntil(timeoutMs: Long = 20_000, predicate: () -> Boolean): Boolean {
    val deadline = System.nanoTime() + timeoutMs * 1_000_000
    while (System.nanoTime() < deadline) {
        if (predicate()) return true
        Thread.sleep(10)
    }
    return false
}

/** An app's own HTTP stack on java.net.http: returns any status, maps "no answer" to a typed error. */
open class JavaHttpTransport : HttpTransport {
    val calls = AtomicInteger()
    private val client = HttpClient.newBuilder()
        .followRedirects(HttpClient.Redirect.NEVER)
        .version(HttpClient.Version.HTTP_1_1)
        .connectTimeout(Duration.ofSeconds(5))
        .build()

    override fun send(request: TransportRequest): TransportResponse {
        calls.incrementAndGet()
        val builder = HttpRequest.newBuilder(URI(request.url))
            .timeout(Duration.ofMillis(request.timeoutMs.toLong()))
            .method(request.method, HttpRequest.BodyPublishers.ofByteArray(request.body))
        // java.net.http sets these itself and refuses them as user headers.
        request.headers.filterKeys { it.lowercase() !in setOf("content-length", "host", "connection") }
            .forEach { (name, value) -> builder.header(name, value) }
        try {
            val response = client.send(builder.build(), HttpResponse.BodyHandlers.ofByteArray())
            return TransportResponse(
                status = response.statusCode().toUShort(),
                headers = response.headers().map().mapValues { it.value.firstOrNull() ?: "" },
                body = response.body(),
            )
        } catch (e: HttpConnectTimeoutException) {
            throw HttpTransportException.Timeout()
        } catch (e: HttpTimeoutException) {
            throw HttpTransportException.Timeout()
        } catch (e: java.net.ConnectException) {
            throw HttpTransportException.Connect(e.toString())
        } catch (e: java.io.IOException) {
            throw HttpTransportException.Io(e.toString())
        }
    }
}

/** Throws an undeclared exception on its first [failures] calls, then delivers. */
class FlakyTransport(failures: Int) : JavaHttpTransport() {
    val left = AtomicInteger(failures)
    override fun send(request: TransportRequest): TransportResponse {
        if (left.getAndDecrement() > 0) throw IllegalStateException("the app's HTTP stack blew up")
        return super.send(request)
    }
}

class Recorder : DeliveryObserver {
    val statuses = CopyOnWriteArrayList<DeliveryStatus>()
    val notices = CopyOnWriteArrayList<SpoolNotice>()
    override fun onState(status: DeliveryStatus) { statuses.add(status) }
    override fun onNotice(notice: SpoolNotice) { notices.add(notice) }
    fun states(): List<DeliveryState> = statuses.map { it.state }
}

class ThrowingObserver : DeliveryObserver {
    val calls = AtomicInteger()
    override fun onState(status: DeliveryStatus) {
        calls.incrementAndGet()
        throw IllegalStateException("observer bug")
    }
    override fun onNotice(notice: SpoolNotice) = throw IllegalStateException("observer bug")
}
