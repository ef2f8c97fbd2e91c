package eventspool

import dev.eventspool.OkHttpTransport
import dev.eventspool.Spool
import java.nio.file.Path
import java.util.concurrent.TimeUnit
import mockwebserver3.MockResponse
import mockwebserver3.MockWebServer
import mockwebserver3.SocketEffect
import org.junit.jupiter.api.AfterEach
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeEach
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import org.junit.jupiter.api.io.TempDir
import uniffi.eventspool.HttpTransportException
import uniffi.eventspool.TransportRequest

/** OkHttpTransport against OkHttp's MockWebServer (the exchange) and the collector (the SDK through it). */
class OkHttpTransportTest {
    private val server = MockWebServer()
    private val transport = OkHttpTransport()

    @BeforeEach
    fun start() = server.start()

    @AfterEach
    fun stop() = server.close()

    private fun post(path: String = "/v1/batch", timeoutMs: ULong = 2_000uL, maxResponseBytes: ULong = 64uL * 1024uL) = TransportRequest(
        method = "POST", url = server.url(path).toString(),
        headers = mapOf("content-type" to "application/json", "content-encoding" to "identity", "authorization" to "Bearer k-1", "content-length" to "13"),
        body = """{"events":[]}""".toByteArray(), timeoutMs = timeoutMs, maxResponseBytes = maxResponseBytes,
    )

    @Test
    fun `sends the SDK's method, headers and body and returns the answer as it is`() {
        server.enqueue(MockResponse.Builder().code(429).addHeader("Retry-After", "7").body("slow down").build())
        val response = transport.send(post())
        assertEquals(429.toUShort(), response.status)
        assertEquals("7", response.headers.entries.single { it.key.equals("retry-after", true) }.value)
        assertArrayEquals("slow down".toByteArray(), response.body)
        val recorded = server.takeRequest(5, TimeUnit.SECONDS)!!
        assertEquals("POST", recorded.method)
        assertEquals("/v1/batch", recorded.url.encodedPath)
        assertEquals("Bearer k-1", recorded.headers["Authorization"])
        assertEquals("13", recorded.headers["Content-Length"])
        assertEquals("""{"events":[]}""", recorded.body!!.utf8())
    }

    @Test
    fun `a redirect comes back to the SDK, not followed`() {
        server.enqueue(MockResponse.Builder().code(307).addHeader("Location", server.url("/elsewhere").toString()).build())
        server.enqueue(MockResponse.Builder().code(200).build())
        assertEquals(307.toUShort(), transport.send(post()).status)
        assertEquals(1, server.requestCount)
    }

    @Test
    fun `a dropped connection is one typed failure, not a silent OkHttp retry`() {
        server.enqueue(MockResponse.Builder().onRequestStart(SocketEffect.CloseSocket()).build())
        server.enqueue(MockResponse.Builder().code(200).build())
        assertThrows<HttpTransportException.Io> { transport.send(post()) }
        assertEquals(1, server.requestCount)
    }

    @Test
    fun `the SDK's timeout bounds the whole exchange`() {
        server.enqueue(MockResponse.Builder().code(200).headersDelay(3, TimeUnit.SECONDS).build())
        val start = System.nanoTime()
        assertThrows<HttpTransportException.Timeout> { transport.send(post(timeoutMs = 300uL)) }
        val tookMs = (System.nanoTime() - start) / 1_000_000
        assertTrue(tookMs in 250..2_500, "took $tookMs ms")
    }

    @Test
    fun `a huge answer is read only up to the SDK's bound`() {
        val huge = okio.Buffer().apply { repeat(8 * 1024) { write(ByteArray(1024) { 'x'.code.toByte() }) } }
        server.enqueue(MockResponse.Builder().code(200).body(huge).build())
        val response = transport.send(post())
        // One byte over the bound tells the SDK the answer was cut (it never counts a cut 2xx as delivered).
        assertTrue(response.body.size <= 64 * 1024 + 1, "read ${response.body.size} bytes of an 8 MiB answer")
    }

    @Test
    fun `nobody listening is a Connect failure`() {
        val port = server.port
        server.close()
        val request = post().copy(url = "http://127.0.0.1:$port/v1/batch")
        assertThrows<HttpTransportException.Connect> { transport.send(request) }
    }

    @Test
    fun `the spool delivers through OkHttp to the collector`(@TempDir dir: Path) {
        val collector = CollectorProcess(dir.resolve("collector.db")).start()
        try {
            Spool(fastConfig(collector.url, dir.resolve("events.db"), maxBatchEvents = 50uL), transport = OkHttpTransport()).use { spool ->
                repeat(220) { spool.track("okhttp", mapOf("i" to it)) }
                spool.flushBlocking()
                assertTrue(spool.waitDrainedBlocking(20_000))
                assertEquals(220L, collector.distinct())
                assertTrue(spool.statsBlocking().requests >= 5uL)
            }
        } finally {
            collector.stop()
        }
    }
}
