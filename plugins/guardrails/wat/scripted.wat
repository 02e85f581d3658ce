;; A guardrail written by hand in the component text format, for tests: the host's unit tests
;; use it, and the integration tests fall back on it when the Rust examples cannot be built.
;;
;; Its `config` is a JSON string whose first letter picks what every check does:
;;   "allow"   allow                  "deny"    deny ("denied by the scripted guardrail")
;;   "rewrite" rewrite: every message / answer / delta becomes "[redacted]"
;;   "trap"    trap (unreachable)     "loop"    loop forever
;;   "memory"  grow memory until refused, then trap
;;   "bad"     a verdict that does not fit (rewrite-text from check-request and so on)
;;   "init"    init refuses the config
;; Anything else allows.
(component
  (core module $m
    (import "res" "new" (func $sc_new (param i32) (result i32)))
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 4096))
    (global $mode (mut i32) (i32.const 97))
    (data (i32.const 16) "denied by the scripted guardrail")
    (data (i32.const 64) "[redacted]")
    (data (i32.const 80) "bad config")

    (func $realloc (export "cabi_realloc")
      (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
      (local $p i32)
      (local.set $p
        (i32.and
          (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
          (i32.sub (i32.const 0) (local.get $align))))
      (global.set $heap (i32.add (local.get $p) (local.get $size)))
      (block $ok
        (loop $grow
          (br_if $ok (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
          (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))
          (br $grow)))
      (if (local.get $old)
        (then (memory.copy (local.get $p) (local.get $old) (local.get $old_size))))
      (local.get $p))

    ;; The return area of every call is at 128: a discriminant byte, then (pointer, length).
    (func $ret (param $case i32) (param $ptr i32) (param $len i32) (result i32)
      (i32.store8 (i32.const 128) (local.get $case))
      (i32.store (i32.const 132) (local.get $ptr))
      (i32.store (i32.const 136) (local.get $len))
      (i32.const 128))

    (func (export "init") (param $ptr i32) (param $len i32) (result i32)
      (global.set $mode (i32.const 97))
      (if (i32.ge_u (local.get $len) (i32.const 2))
        (then
          (if (i32.eq (i32.load8_u (local.get $ptr)) (i32.const 34))
            (then (global.set $mode (i32.load8_u offset=1 (local.get $ptr)))))))
      (if (i32.eq (global.get $mode) (i32.const 105))
        (then (return (call $ret (i32.const 1) (i32.const 80) (i32.const 10)))))
      (call $ret (i32.const 0) (i32.const 0) (i32.const 0)))

    (func $misbehave
      ;; t: trap
      (if (i32.eq (global.get $mode) (i32.const 116)) (then unreachable))
      ;; l: loop forever
      (if (i32.eq (global.get $mode) (i32.const 108)) (then (loop $forever (br $forever))))
      ;; m: grow by 1 MiB until refused, then trap as an allocator would
      (if (i32.eq (global.get $mode) (i32.const 109))
        (then
          (loop $more
            (br_if $more (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
          unreachable)))

    (func $is (param $letter i32) (result i32)
      (i32.eq (global.get $mode) (local.get $letter)))

    ;; Every message's content becomes "[redacted]" (the list is the one the host lowered).
    (func $redact_messages (param $ptr i32) (param $len i32) (result i32)
      (local $i i32)
      (local $at i32)
      (block $done
        (loop $each
          (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
          (local.set $at (i32.add (local.get $ptr) (i32.mul (local.get $i) (i32.const 16))))
          (i32.store offset=8 (local.get $at) (i32.const 64))
          (i32.store offset=12 (local.get $at) (i32.const 10))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $each)))
      (call $ret (i32.const 2) (local.get $ptr) (local.get $len)))

    (func (export "check-request")
      (param i32 i32 i32) (param $msgs i32) (param $msgs_len i32) (param i32 i32) (result i32)
      (call $misbehave)
      (if (call $is (i32.const 100)) (then (return (call $ret (i32.const 1) (i32.const 16) (i32.const 32)))))
      (if (call $is (i32.const 114)) (then (return (call $redact_messages (local.get $msgs) (local.get $msgs_len)))))
      (if (call $is (i32.const 98)) (then (return (call $ret (i32.const 3) (i32.const 64) (i32.const 10)))))
      (call $ret (i32.const 0) (i32.const 0) (i32.const 0)))

    (func $text_verdict (result i32)
      (call $misbehave)
      (if (call $is (i32.const 100)) (then (return (call $ret (i32.const 1) (i32.const 16) (i32.const 32)))))
      (if (call $is (i32.const 114)) (then (return (call $ret (i32.const 3) (i32.const 64) (i32.const 10)))))
      (if (call $is (i32.const 98)) (then (return (call $ret (i32.const 2) (i32.const 0) (i32.const 0)))))
      (call $ret (i32.const 0) (i32.const 0) (i32.const 0)))

    (func (export "check-response") (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
      (call $text_verdict))

    (func (export "stream-new") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
      (call $sc_new (i32.const 0)))

    (func (export "stream-push") (param i32 i32 i32) (result i32)
      (call $text_verdict))

    (func (export "stream-finish") (param i32) (result i32)
      (call $ret (i32.const 0) (i32.const 0) (i32.const 0))))

  (type $message (record (field "role" string) (field "content" string)))
  (type $chat-request (record
    (field "model" (option string))
    (field "messages" (list $message))
    (field "tools" (list string))))
  (type $verdict (variant
    (case "allow")
    (case "deny" string)
    (case "rewrite-messages" (list $message))
    (case "rewrite-text" string)))
  (type $stream-checker (resource (rep i32)))

  (core func $sc_new (canon resource.new $stream-checker))
  (core instance $res (export "new" (func $sc_new)))
  (core instance $i (instantiate $m (with "res" (instance $res))))
  (alias core export $i "memory" (core memory $mem))
  (alias core export $i "cabi_realloc" (core func $realloc))

  (func $init (param "config" string) (result (result (error string)))
    (canon lift (core func $i "init") (memory $mem) (realloc $realloc)))
  (func $check-request (param "request" $chat-request) (result $verdict)
    (canon lift (core func $i "check-request") (memory $mem) (realloc $realloc)))
  (func $check-response (param "request" $chat-request) (param "response-text" string) (result $verdict)
    (canon lift (core func $i "check-response") (memory $mem) (realloc $realloc)))
  (func $new (param "request" $chat-request) (result (own $stream-checker))
    (canon lift (core func $i "stream-new") (memory $mem) (realloc $realloc)))
  (func $push (param "self" (borrow $stream-checker)) (param "delta" string) (result $verdict)
    (canon lift (core func $i "stream-push") (memory $mem) (realloc $realloc)))
  (func $finish (param "self" (borrow $stream-checker)) (result $verdict)
    (canon lift (core func $i "stream-finish") (memory $mem) (realloc $realloc)))

  ;; The exported interface, built by a component that takes the types and functions above and
  ;; exports them under the interface's names (a function may only use types exported by name).
  (component $interface
    (import "t-stream-checker" (type $sc-in (sub resource)))
    (type $message-def (record (field "role" string) (field "content" string)))
    (import "t-message" (type $message-in (eq $message-def)))
    (type $request-def (record
      (field "model" (option string))
      (field "messages" (list $message-in))
      (field "tools" (list string))))
    (import "t-chat-request" (type $request-in (eq $request-def)))
    (type $verdict-def (variant
      (case "allow")
      (case "deny" string)
      (case "rewrite-messages" (list $message-in))
      (case "rewrite-text" string)))
    (import "t-verdict" (type $verdict-in (eq $verdict-def)))
    (import "f-init" (func $init (param "config" string) (result (result (error string)))))
    (import "f-check-request" (func $check-request (param "request" $request-in) (result $verdict-in)))
    (import "f-check-response"
      (func $check-response (param "request" $request-in) (param "response-text" string) (result $verdict-in)))
    (import "f-new" (func $new (param "request" $request-in) (result (own $sc-in))))
    (import "f-push" (func $push (param "self" (borrow $sc-in)) (param "delta" string) (result $verdict-in)))
    (import "f-finish" (func $finish (param "self" (borrow $sc-in)) (result $verdict-in)))

    ;; Each exported type is described again in terms of the exported types it uses.
    (export $message "message" (type $message-in))
    (type $request-out (record
      (field "model" (option string))
      (field "messages" (list $message))
      (field "tools" (list string))))
    (export $request "chat-request" (type $request-in) (type (eq $request-out)))
    (type $verdict-out (variant
      (case "allow")
      (case "deny" string)
      (case "rewrite-messages" (list $message))
      (case "rewrite-text" string)))
    (export $verdict "verdict" (type $verdict-in) (type (eq $verdict-out)))
    (export $sc "stream-checker" (type $sc-in))
    (export "init" (func $init))
    (export "check-request" (func $check-request)
      (func (param "request" $request) (result $verdict)))
    (export "check-response" (func $check-response)
      (func (param "request" $request) (param "response-text" string) (result $verdict)))
    (export "[constructor]stream-checker" (func $new)
      (func (param "request" $request) (result (own $sc))))
    (export "[method]stream-checker.push" (func $push)
      (func (param "self" (borrow $sc)) (param "delta" string) (result $verdict)))
    (export "[method]stream-checker.finish" (func $finish)
      (func (param "self" (borrow $sc)) (result $verdict))))

  (instance $guardrail (instantiate $interface
    (with "t-stream-checker" (type $stream-checker))
    (with "t-message" (type $message))
    (with "t-chat-request" (type $chat-request))
    (with "t-verdict" (type $verdict))
    (with "f-init" (func $init))
    (with "f-check-request" (func $check-request))
    (with "f-check-response" (func $check-response))
    (with "f-new" (func $new))
    (with "f-push" (func $push))
    (with "f-finish" (func $finish))))
  (export "gateway:guardrail/guardrail@0.1.0" (instance $guardrail)))
