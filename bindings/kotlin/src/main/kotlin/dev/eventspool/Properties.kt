package dev.eventspool

import kotlinx.serialization.json.JsonArray
import kotlinx.serialization.json.JsonElement
import kotlinx.serialization.json.JsonNull
import kotlinx.serialization.json.JsonObject
import kotlinx.serialization.json.JsonPrimitive

/**
 * `Map<String, Any?>` → a JSON object, with kotlinx.serialization's `JsonElement` tree.
 *
 * The conversion runs on the caller's thread and copies every value, so an app that mutates its
 * map after `track()` returns never changes what was tracked; the text is written later, on the
 * hand-off thread. JSON's own kinds, plus what apps put in analytics properties all the time and
 * that has one obvious JSON form: times as ISO 8601 text in UTC (`Date`, `Calendar`, `Instant`,
 * the `java.time` dates and times in their own ISO form, `Duration` as `PT1M30S`), enums by
 * name, `UUID` as text, any `Iterable`, primitive arrays. No reflection, nothing for R8 to keep:
 * anything else is refused with the key path that holds it rather than sent as `toString()`,
 * and so are `NaN` and the infinities, named, since JSON has no number for them.
 */
internal object Properties {
    /** How deep nested maps and lists may go: a cycle in the app's data ends here, not in a stack overflow. */
    const val MAX_DEPTH = 32

    fun toJson(properties: Map<String, Any?>): JsonObject = JsonObject(objectOf(properties, "", 0))

    private fun objectOf(map: Map<*, *>, path: String, depth: Int): Map<String, JsonElement> {
        val out = LinkedHashMap<String, JsonElement>(capacity(map.size))
        for ((k, v) in map) {
            val key = k as? String ?: throw PropertyException(path.ifEmpty { "properties" }, "a key is ${kind(k)}, not a String")
            out[key] = element(v, if (path.isEmpty()) key else "$path.$key", depth)
        }
        return out
    }

    private fun element(value: Any?, path: String, depth: Int): JsonElement {
        if (depth >= MAX_DEPTH) throw PropertyException(path, "nested deeper than $MAX_DEPTH levels")
        return when (value) {
            null -> JsonNull
            is String -> JsonPrimitive(value)
            is Boolean -> JsonPrimitive(value)
            is Int, is Long, is Short, is Byte -> JsonPrimitive(value as Number)
            is Double -> finite(value, path)
            is Float -> finite(value.toDouble(), path)
            is UInt -> JsonPrimitive(value.toLong())
            is ULong -> JsonPrimitive(value)
            is java.math.BigDecimal, is java.math.BigInteger -> JsonPrimitive(value as Number)
            is Char -> JsonPrimitive(value.toString())
            is CharSequence -> JsonPrimitive(value.toString())
            is Enum<*> -> JsonPrimitive(value.name)
            is JsonElement -> value
            is Map<*, *> -> JsonObject(objectOf(value, path, depth + 1))
            is Iterable<*> -> JsonArray(value.mapIndexed { i, v -> element(v, "$path[$i]", depth + 1) })
            is Array<*> -> JsonArray(value.mapIndexed { i, v -> element(v, "$path[$i]", depth + 1) })
            is IntArray -> JsonArray(value.map { JsonPrimitive(it) })
            is LongArray -> JsonArray(value.map { JsonPrimitive(it) })
            is ShortArray -> JsonArray(value.map { JsonPrimitive(it) })
            is ByteArray -> JsonArray(value.map { JsonPrimitive(it) })
            is BooleanArray -> JsonArray(value.map { JsonPrimitive(it) })
            is DoubleArray -> JsonArray(value.mapIndexed { i, d -> finite(d, "$path[$i]") })
            is FloatArray -> JsonArray(value.mapIndexed { i, f -> finite(f.toDouble(), "$path[$i]") })
            is CharArray -> JsonPrimitive(String(value))
            else -> time(value) ?: throw PropertyException(path, "${kind(value)} has no JSON form (use String, Number, Boolean, Map, List or null)")
        }
    }

    private fun finite(d: Double, path: String): JsonPrimitive {
        if (d.isNaN() || d.isInfinite()) throw PropertyException(path, "$d is not a JSON number (send null, or a string)")
        return JsonPrimitive(d)
    }

    /** A point in time or a span as ISO 8601 text; null for anything else. */
    private fun time(value: Any): JsonPrimitive? = when (value) {
        // Instants in UTC with a `Z`: what collectors parse and sort without a time zone table.
        is java.util.Date -> JsonPrimitive(java.time.Instant.ofEpochMilli(value.time).toString())
        is java.util.Calendar -> JsonPrimitive(java.time.Instant.ofEpochMilli(value.timeInMillis).toString())
        is java.time.Instant -> JsonPrimitive(value.toString())
        is java.time.ZonedDateTime -> JsonPrimitive(value.toOffsetDateTime().toString())
        // Their own ISO form: an offset, a local date or time is what the app meant to record.
        is java.time.temporal.TemporalAccessor -> JsonPrimitive(value.toString())
        is java.time.Duration, is java.time.Period -> JsonPrimitive(value.toString())
        is java.util.UUID -> JsonPrimitive(value.toString())
        else -> null
    }

    private fun kind(v: Any?): String = if (v == null) "null" else v::class.java.name

    private fun capacity(n: Int) = if (n < 3) n + 1 else (n / 0.75f + 1f).toInt()
}
