#include "textflag.h"

// func stringRun(s []byte) (k int, esc bool)
// Returns the index of the first byte of s that is '"', below 0x20, or a
// backslash that does not start a two-byte escape (\" \\ \/ \b \f \n \r
// \t), len(s) when there is none; the two-byte escapes on the way are
// skipped, esc reports whether there was one. len(s) must be at least 16
// (the last 16 bytes are read in one load that overlaps the ones before).
// 64 bytes a step with AVX2 (useAVX2) while 64 are left, then 32 bytes a
// step, then 16, then the overlapping last 16 (SSE2).
TEXT ·stringRun(SB), NOSPLIT, $0-33
	MOVQ s_base+0(FP), SI
	MOVQ s_len+8(FP), CX
	MOVQ SI, DI
	LEAQ (SI)(CX*1), R9    // the end
	LEAQ -16(R9), DX       // the last 16 bytes
	LEAQ -32(R9), R8       // a 32-byte step must start at or before R8
	XORL R10, R10          // esc
	MOVQ $0x2222222222222222, AX
	MOVQ AX, X1
	PUNPCKLQDQ X1, X1
	MOVQ $0x5c5c5c5c5c5c5c5c, AX
	MOVQ AX, X2
	PUNPCKLQDQ X2, X2
	MOVQ $0x1f1f1f1f1f1f1f1f, AX
	MOVQ AX, X3
	PUNPCKLQDQ X3, X3
	PXOR X0, X0
	LEAQ -64(R9), R11      // a 64-byte step must start at or before R11
	CMPB ·useAVX2(SB), $0
	JEQ  loop32
	CMPQ SI, R11
	JA   loop32
	VPBROADCASTB X1, Y1
	VPBROADCASTB X2, Y2
	VPBROADCASTB X3, Y3
	VPXOR Y0, Y0, Y0

loop64:
	VMOVDQU (SI), Y4
	VMOVDQU 32(SI), Y7
	VPCMPEQB Y1, Y4, Y5
	VPCMPEQB Y2, Y4, Y6
	VPSUBUSB Y3, Y4, Y4
	VPCMPEQB Y0, Y4, Y4
	VPOR Y5, Y6, Y5
	VPOR Y4, Y5, Y5
	VPCMPEQB Y1, Y7, Y8
	VPCMPEQB Y2, Y7, Y9
	VPSUBUSB Y3, Y7, Y7
	VPCMPEQB Y0, Y7, Y7
	VPOR Y8, Y9, Y8
	VPOR Y7, Y8, Y8
	VPOR Y5, Y8, Y10
	VPTEST Y10, Y10
	JNZ  found64
	ADDQ $64, SI
	CMPQ SI, R11
	JBE  loop64
	VZEROUPPER
	JMP  loop32

found64:
	VPMOVMSKB Y5, AX
	VPMOVMSKB Y8, BX
	SHLQ $32, BX
	ORQ  BX, AX
	BSFQ AX, AX
	ADDQ SI, AX
	// After the special byte (an escape: one is likely to have more; a
	// 64-byte step that finds the next a few bytes on measured slower on
	// the tool results' body) the rest goes 32 bytes a step.
	VZEROUPPER
	JMP  special

loop32:
	CMPQ SI, R8
	JA   loop16
	MOVOU (SI), X4
	MOVOU 16(SI), X7
	MOVOU X4, X5
	MOVOU X4, X6
	MOVOU X7, X8
	MOVOU X7, X9
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	PCMPEQB X1, X8
	PCMPEQB X2, X9
	PSUBUSB X3, X7
	PCMPEQB X0, X7
	POR X5, X4
	POR X6, X4
	POR X8, X7
	POR X9, X7
	PMOVMSKB X4, AX
	PMOVMSKB X7, BX
	SHLL $16, BX
	ORL BX, AX
	JNZ found
	ADDQ $32, SI
	JMP loop32

loop16:
	// SI > R8: at most one 16-byte step before the last load.
	CMPQ SI, DX
	JAE  last
	MOVOU (SI), X4
	MOVOU X4, X5
	MOVOU X4, X6
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	POR X5, X4
	POR X6, X4
	PMOVMSKB X4, AX
	TESTL AX, AX
	JNZ found
	ADDQ $16, SI

last:
	// SI in [DX, DX+16): the bytes before SI were checked.
	MOVOU (DX), X4
	MOVOU X4, X5
	MOVOU X4, X6
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	POR X5, X4
	POR X6, X4
	PMOVMSKB X4, AX
	MOVQ SI, CX
	SUBQ DX, CX // bytes of the last load already checked
	SHRL CX, AX
	TESTL AX, AX
	JZ none
	BSFL AX, AX
	ADDQ SI, AX
	JMP special

found:
	BSFL AX, AX
	ADDQ SI, AX

special:
	// AX points at the special byte.
	MOVBLZX (AX), BX
	CMPL BX, $0x5c
	JNE ret
	LEAQ 1(AX), CX
	CMPQ CX, R9
	JAE ret // a backslash at the end
	MOVBLZX (CX), BX
	CMPL BX, $0x22
	JEQ skip
	CMPL BX, $0x5c
	JEQ skip
	CMPL BX, $0x2f
	JEQ skip
	CMPL BX, $0x62
	JEQ skip
	CMPL BX, $0x66
	JEQ skip
	CMPL BX, $0x6e
	JEQ skip
	CMPL BX, $0x72
	JEQ skip
	CMPL BX, $0x74
	JEQ skip
	JMP ret

skip:
	MOVL $1, R10
	LEAQ 2(AX), SI
	CMPQ SI, R9
	JB loop32

none:
	MOVQ s_len+8(FP), AX
	MOVQ AX, k+24(FP)
	MOVB R10, esc+32(FP)
	RET

ret:
	SUBQ DI, AX
	MOVQ AX, k+24(FP)
	MOVB R10, esc+32(FP)
	RET

// func cpuAVX2() bool
// Reports AVX2 with the OS saving the YMM state (CPUID, XGETBV).
TEXT ·cpuAVX2(SB), NOSPLIT, $0-1
	XORL AX, AX
	XORL CX, CX
	CPUID
	CMPL AX, $7
	JB   no
	MOVL $1, AX
	XORL CX, CX
	CPUID
	ANDL $0x18000000, CX // OSXSAVE and AVX
	CMPL CX, $0x18000000
	JNE  no
	XORL CX, CX
	XGETBV
	ANDL $6, AX // XMM and YMM state
	CMPL AX, $6
	JNE  no
	MOVL $7, AX
	XORL CX, CX
	CPUID
	BTL  $5, BX // AVX2
	JCC  no
	MOVB $1, ret+0(FP)
	RET

no:
	MOVB $0, ret+0(FP)
	RET
