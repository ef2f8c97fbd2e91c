// swift-tools-version:5.9
// The eventspool Swift package: the generated bindings (Sources/EventSpool/eventspool.swift)
// over the Rust library packaged as an XCFramework. Build both on macOS first:
//   bash bindings/generate.sh && bash bindings/swift/build-xcframework.sh
import PackageDescription

let package = Package(
    name: "EventSpool",
    platforms: [.iOS(.v15), .macOS(.v12)],
    products: [
        .library(name: "EventSpool", targets: ["EventSpool"]),
    ],
    targets: [
        // Static libraries for iOS devices, the iOS simulator and macOS, with the C header and
        // module map of the `eventspoolFFI` module the generated Swift imports.
        .binaryTarget(name: "eventspoolFFI", path: "eventspoolFFI.xcframework"),
        .target(
            name: "EventSpool",
            dependencies: ["eventspoolFFI"],
            path: "Sources/EventSpool"
        ),
    ]
)
