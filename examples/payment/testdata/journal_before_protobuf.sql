-- Payment events as the payment example stored them before its events moved
-- to Protobuf (examples/payment/payment.hpp at main b75a594: ByteWriter
-- codecs, manifests without a package, SettlementAccepted v2; the two
-- "v1-" payments hold SettlementAccepted v1 rows, the layout of the builds
-- before the customer field). Written through SqliteJournal by a program
-- that encoded each event with that build's payment_codecs(); dumped with
--   sqlite3 journal.db ".mode insert events" "SELECT * FROM events ORDER BY persistence_id, seq"
-- The table is the SQLite journal's (doc/journal.md). Replayed through
-- today's codecs and upcasters by old_journal.test.cpp.
INSERT INTO events VALUES('payment|cancelled',1,1767225600020,'PaymentCreated',1,X'07000000637573742d3130070000006f726465722d36f401000000000000');
INSERT INTO events VALUES('payment|cancelled',2,1767225600040,'PaymentCancelled',1,X'0000000000000000');
INSERT INTO events VALUES('payment|created-completed',1,1767225600020,'PaymentCreated',1,X'06000000637573742d37070000006f726465722d336810000000000000');
INSERT INTO events VALUES('payment|created-completed',2,1767225600040,'SettlementAccepted',2,X'070000006f726465722d33681000000000000028a8da769b01000006000000637573742d37');
INSERT INTO events VALUES('payment|created-completed',3,1767225600060,'SettlementSucceeded',1,X'0d000000415554482d3030433046464545');
INSERT INTO events VALUES('payment|declined',1,1767225600020,'SettlementAccepted',2,X'070000006f726465722d344d0000000000000014a8da769b01000006000000637573742d38');
INSERT INTO events VALUES('payment|declined',2,1767225600040,'SettlementDeclined',1,X'120000006465636c696e656420627920697373756572');
INSERT INTO events VALUES('payment|gateway-error',1,1767225600020,'SettlementAccepted',2,X'070000006f726465722d35360100000000000014a8da769b01000006000000637573742d39');
INSERT INTO events VALUES('payment|gateway-error',2,1767225600040,'SettlementFailed',1,X'28000000756e726561636861626c653a20676174657761793a20636f6e6e656374696f6e2072656675736564');
INSERT INTO events VALUES('payment|refund-retried',1,1767225600020,'SettlementAccepted',2,X'070000006f726465722d38d00700000000000014a8da769b01000007000000637573742d3132');
INSERT INTO events VALUES('payment|refund-retried',2,1767225600040,'SettlementSucceeded',1,X'0d000000415554482d3837363534333231');
INSERT INTO events VALUES('payment|refund-retried',3,1767225600060,'PaymentCancelled',1,X'd007000000000000');
INSERT INTO events VALUES('payment|refund-retried',4,1767225600080,'RefundNotQueued',1,X'3800000074696d656f75743a2074686520726566756e6420717565756520646964206e6f7420616e737765722077697468696e203135303030206d73');
INSERT INTO events VALUES('payment|refund-retried',5,1767225600100,'RefundRetried',1,X'');
INSERT INTO events VALUES('payment|refund-retried',6,1767225600120,'RefundQueued',1,X'2a00000000000000');
INSERT INTO events VALUES('payment|refunded',1,1767225600020,'SettlementAccepted',2,X'070000006f726465722d37f04902000000000014a8da769b01000007000000637573742d3131');
INSERT INTO events VALUES('payment|refunded',2,1767225600040,'SettlementSucceeded',1,X'0d000000415554482d3132333435363738');
INSERT INTO events VALUES('payment|refunded',3,1767225600060,'PaymentCancelled',1,X'f049020000000000');
INSERT INTO events VALUES('payment|refunded',4,1767225600080,'RefundQueued',1,X'2900000000000000');
INSERT INTO events VALUES('payment|v1-completed',1,1767225600020,'SettlementAccepted',1,X'070000006f726465722d31e20400000000000014a8da769b010000');
INSERT INTO events VALUES('payment|v1-completed',2,1767225600040,'SettlementSucceeded',1,X'0d000000415554482d3030303041314232');
INSERT INTO events VALUES('payment|v1-timed-out',1,1767225600020,'SettlementAccepted',1,X'070000006f726465722d32de0300000000000014a8da769b010000');
INSERT INTO events VALUES('payment|v1-timed-out',2,1767225600040,'SettlementTimedOut',1,X'983a000000000000');
